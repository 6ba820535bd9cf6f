// Package dynamic verifies the signatures of the Gemini API's dynamic
// (per-job) webhook deliveries against the key set (JWKS) the API
// publishes (spec §6). It owns the two signature schemes the official
// documents and live deliveries disagree on — Standard Webhooks' `v1a`
// (Ed25519 over id.timestamp.body) and an RS256 JWT — and the key set's
// cache: when to fetch it, how long to keep it, and when fetching is
// refused so that no request can make the receiver hammer the key server.
//
// It does not own the HMAC (`v1`) scheme of static webhooks (package
// webhook does), nor what a verified delivery means: the JWKS is
// Google-wide, so a dynamic signature proves that Google sent the
// request, not that it concerns this project. Result.Scheme says which
// scheme verified, so that the caller can require confirmation against the API (spec §6)
// for keys seen only through a dynamic signature.
package dynamic

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/gemrecon/gemrecon/canon"
)

// DefaultJWKSURL is where the Gemini API publishes the keys of its dynamic
// webhook signatures.
const DefaultJWKSURL = "https://generativelanguage.googleapis.com/.well-known/jwks.json"

// Tolerance is how far a v1a webhook-timestamp may lie from the
// receiver's clock, either way, and the leeway given to a JWT's exp, nbf
// and iat: Standard Webhooks' five minutes.
const Tolerance = 5 * time.Minute

// MaxEntries is the most signature entries (over all webhook-signature
// lines) a request may carry. Each entry costs signature checks, so this
// bounds the work one request can cause; a sender rotating keys carries
// two or three.
const MaxEntries = 16

// The Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Scheme names the signature scheme that verified a request.
type Scheme string

// The schemes.
const (
	// SchemeV1a is Standard Webhooks' asymmetric scheme: an Ed25519
	// signature over webhook-id, webhook-timestamp and the body.
	SchemeV1a Scheme = "v1a"
	// SchemeJWT is an RS256 JWT; it binds neither the body nor the id.
	SchemeJWT Scheme = "jwt"
)

// The kinds of verification errors; every error Verify returns matches
// exactly one of ErrUnverified and ErrUnavailable under errors.Is.
var (
	// ErrUnverified: no entry verifies — a bad, stale or malformed
	// signature, a refused algorithm, an unknown kid. The handler answers
	// 401.
	ErrUnverified = errors.New("dynamic webhook signature not verified")
	// ErrUnavailable: the key set could not be fetched (and none usable is
	// cached), so a well-formed, timely entry could not be judged. The
	// handler answers 503 so that the sender retries.
	ErrUnavailable = errors.New("the Gemini API's webhook key set is unavailable")
	// ErrNoEntry: the request carries no v1a or JWT entry at all (only
	// HMAC v1 entries, say). It is an ErrUnverified, returned without
	// touching the key set; a handler that also verifies HMAC reports the
	// HMAC verifier's error instead.
	ErrNoEntry = fmt.Errorf("%w: webhook-signature has no v1a or JWT entry", ErrUnverified)
)

// Result says how a request was verified.
type Result struct {
	// Scheme is SchemeV1a or SchemeJWT.
	Scheme Scheme
	// KeyID is the kid of the key that verified ("" for a key published
	// without one).
	KeyID string
}

// Config configures a Verifier.
type Config struct {
	// JWKSURL is the key set's address (http or https); "" means
	// DefaultJWKSURL.
	JWKSURL string
	// Audience, when set, must be among a JWT's aud values; when empty,
	// aud is not checked (the Gemini API documents no audience).
	Audience string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives one line per fetch (info on success, warn on failure);
	// nil discards them.
	Log *slog.Logger
}

// Verifier checks dynamic webhook signatures. It is safe for concurrent
// use; requests share the cached key set and any fetch in progress.
type Verifier struct {
	audience string
	keys     *cache // its clock is the Verifier's
}

// New makes a Verifier. Nothing is fetched until a request needs the key
// set (or Ready is called).
func New(cfg Config) (*Verifier, error) {
	raw := cmp.Or(cfg.JWKSURL, DefaultJWKSURL)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("JWKS URL %q: not an absolute http or https URL", raw)
	}
	// A client of its own; fetches are bounded by DefaultFetchTimeout.
	c := &cache{url: u.String(), client: &http.Client{}, now: cfg.Now, log: cmp.Or(cfg.Log, slog.New(slog.DiscardHandler)), turn: make(chan struct{}, 1)}
	if c.now == nil {
		c.now = time.Now
	}
	return &Verifier{audience: cfg.Audience, keys: c}, nil
}

// URL is the key set's address.
func (v *Verifier) URL() string { return v.keys.url }

// Ready reports whether a usable key set is cached or can be fetched now
// (subject to RefetchInterval, like any request): for a warning at start.
// Its error matches ErrUnavailable.
func (v *Verifier) Ready(ctx context.Context) error {
	if _, _, err := v.keys.get(ctx, false); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// v1aEntry is one v1a signature, decoded.
type v1aEntry struct {
	n   int // position among all entries, from 1, for messages
	sig []byte
}

// jwtEntry is one JWT, parsed (algorithm RS256) but not yet verified.
type jwtEntry struct {
	n   int
	tok *jwt.JSONWebToken
	kid string
}

// Verify checks the dynamic signatures of a request: every entry of every
// webhook-signature line, a request passing when any entry verifies. body
// is the exact bytes received. ctx bounds waiting for a fetch of the key
// set (the fetch itself is not cancelled with it). The error matches
// ErrUnverified (answer 401) or ErrUnavailable (answer 503); it names
// what failed and never quotes a signature, a token or a key.
func (v *Verifier) Verify(ctx context.Context, body []byte, h http.Header) (Result, error) {
	now := v.keys.now()
	v1as, jwts, reasons, err := v.entries(h, now)
	if err != nil {
		return Result{}, err
	}
	var msg []byte // what a v1a entry signs: webhook-id "." webhook-timestamp "." body, as sent
	if len(v1as) > 0 {
		msg = append([]byte(h.Get(HeaderID)+"."+h.Get(HeaderTimestamp)+"."), body...)
	}

	// Only now, with an entry that a key could verify, is the key set
	// needed: a malformed or stale request never causes a fetch.
	ks, _, err := v.keys.get(ctx, false)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	base := len(reasons) // the reasons found before any key was tried
	res, ok, wantFresh := v.try(ks, v1as, msg, jwts, &reasons)
	if ok {
		return res, nil
	}
	if !wantFresh {
		return Result{}, reasons.err(ErrUnverified)
	}
	fresh, current, err := v.keys.get(ctx, true)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if fresh.gen != ks.gen {
		reasons = reasons[:base]
		if res, ok, _ = v.try(fresh, v1as, msg, jwts, &reasons); ok {
			return res, nil
		}
	}
	if !current {
		// The last fetch failed: a key published since the set was
		// fetched may verify this request, so do not call it bad.
		return Result{}, fmt.Errorf("%w: no cached key verifies the request and refreshing the key set failed", ErrUnavailable)
	}
	return Result{}, reasons.err(ErrUnverified)
}

// Check judges a request by its headers alone, as Verify does before it
// needs the body or the key set: the error Verify would return whatever the
// body (ErrNoEntry; or an ErrUnverified naming why no entry could verify:
// too many, malformed, a v1a whose webhook-id or webhook-timestamp is
// missing or outside Tolerance, a JWT refused by its header or claims), or
// nil when some entry could still verify. It never fetches the key set. The
// receiver calls it before it reads a body (spec §6).
func (v *Verifier) Check(h http.Header) error {
	_, _, _, err := v.entries(h, v.keys.now())
	return err
}

// entries gathers and judges the signature entries as far as the headers
// allow, with the reasons the dropped ones failed. It returns an error when
// none is left that a key could verify.
func (v *Verifier) entries(h http.Header, now time.Time) ([]v1aEntry, []jwtEntry, reasonList, error) {
	// Gather the entries first, so that the count is bounded before any
	// of them costs a parse.
	var entries []string
	for _, line := range h.Values(HeaderSignature) {
		for _, e := range strings.Fields(line) {
			// A proxy that folds two header lines into one joins them
			// with ", "; no signature ends with a comma. Other versions
			// than v1a (v1: HMAC, package webhook's; a scheme of the
			// future) are not this package's; a JWT has no comma.
			e = strings.TrimRight(e, ",")
			if strings.HasPrefix(e, "v1a,") || !strings.Contains(e, ",") && strings.Count(e, ".") == 2 {
				entries = append(entries, e)
			}
		}
	}
	if len(entries) == 0 {
		return nil, nil, nil, ErrNoEntry
	}
	if len(entries) > MaxEntries {
		return nil, nil, nil, fmt.Errorf("%w: %d v1a and JWT entries, more than the %d accepted", ErrUnverified, len(entries), MaxEntries)
	}
	var (
		reasons reasonList
		v1as    []v1aEntry
		jwts    []jwtEntry
	)
	for i, e := range entries {
		n := i + 1
		if value, v1a := strings.CutPrefix(e, "v1a,"); !v1a {
			if j, ok := v.parseJWT(e, n, now, &reasons); ok {
				jwts = append(jwts, j)
			}
		} else if sig, ok := decodeSignature(value); ok {
			v1as = append(v1as, v1aEntry{n: n, sig: sig})
		} else {
			reasons.add(fmt.Sprintf("entry %d: v1a signature is not base64 of %d bytes", n, ed25519.SignatureSize))
		}
	}
	if len(v1as) > 0 {
		if err := v1aHeaders(h, now); err != nil {
			reasons.add("v1a: " + err.Error())
			v1as = nil
		}
	}
	if len(v1as) == 0 && len(jwts) == 0 {
		return nil, nil, nil, reasons.err(ErrUnverified)
	}
	return v1as, jwts, reasons, nil
}

// try verifies the entries against one key set. wantFresh reports that a
// newer set might verify what this one did not: a v1a entry no key
// verified, or a JWT whose kid the set lacks. (A JWT whose kid is in the
// set but whose signature fails is bad: a kid names one key.)
func (v *Verifier) try(ks *keySet, v1as []v1aEntry, msg []byte, jwts []jwtEntry, reasons *reasonList) (res Result, ok, wantFresh bool) {
	for _, e := range v1as {
		for _, k := range ks.ed {
			if ed25519.Verify(k.pub, msg, e.sig) {
				return Result{Scheme: SchemeV1a, KeyID: k.kid}, true, false
			}
		}
		wantFresh = true
		reasons.add(fmt.Sprintf("entry %d: no Ed25519 key of the set (%d) verifies the v1a signature", e.n, len(ks.ed)))
	}
	for _, e := range jwts {
		keys := ks.rsa[e.kid]
		if len(keys) == 0 {
			wantFresh = true
			reasons.add(fmt.Sprintf("entry %d: the key set has no RSA key with the JWT's kid %s", e.n, canon.Quote(e.kid)))
			continue
		}
		for _, k := range keys {
			// Its claims were checked before any key was needed
			// (parseJWT): the same bytes, verified now.
			if e.tok.Claims(k, new(jwt.Claims)) == nil {
				return Result{Scheme: SchemeJWT, KeyID: e.kid}, true, false
			}
		}
		reasons.add(fmt.Sprintf("entry %d: the JWT's RS256 signature does not verify with the key of kid %s", e.n, canon.Quote(e.kid)))
	}
	return Result{}, false, wantFresh
}

// checkClaims applies the JWT rules of spec §6. A JWT signs no
// webhook-timestamp, so its own times stand in for it: exp, nbf and iat
// with Tolerance as leeway (go-jose's rules: not expired, not before nbf,
// not issued in the future); a token without exp must carry an iat within
// Tolerance of now, as a v1a webhook-timestamp must, and a token with
// neither is refused, since nothing would ever make it stale. aud is
// checked only when an audience is configured.
func (v *Verifier) checkClaims(c jwt.Claims, now time.Time) error {
	exp := jwt.Expected{Time: now}
	if v.audience != "" {
		exp.AnyAudience = jwt.Audience{v.audience}
	}
	if err := c.ValidateWithLeeway(exp, Tolerance); err != nil {
		switch {
		case errors.Is(err, jwt.ErrExpired):
			return errors.New("has expired (exp is more than 5 minutes past)")
		case errors.Is(err, jwt.ErrNotValidYet):
			return errors.New("is not valid yet (nbf is more than 5 minutes ahead)")
		case errors.Is(err, jwt.ErrIssuedInTheFuture):
			return errors.New("was issued in the future (iat is more than 5 minutes ahead)")
		case errors.Is(err, jwt.ErrInvalidAudience):
			return errors.New("is for another audience (aud does not contain the configured audience)")
		}
		return errors.New("has invalid claims")
	}
	if c.Expiry == nil {
		if c.IssuedAt == nil {
			return errors.New("has neither exp nor iat, so it would never go stale")
		}
		if now.Sub(c.IssuedAt.Time()) > Tolerance {
			return errors.New("has no exp and its iat is more than 5 minutes old")
		}
	}
	return nil
}

// parseJWT parses a compact JWS accepting RS256 only, and keeps it when
// its (not yet verified) claims pass checkClaims, so that an expired or
// foreign token causes no fetch. go-jose refuses any other alg at parse
// time (none, HS*, RS512, PS*, ES*, EdDSA, …), so an HS256 token keyed with
// the RSA public key never reaches a key; its error names the alg it
// refused.
func (v *Verifier) parseJWT(s string, n int, now time.Time, reasons *reasonList) (jwtEntry, bool) {
	tok, err := jwt.ParseSigned(s, []jose.SignatureAlgorithm{jose.RS256})
	var alg *jose.ErrUnexpectedSignatureAlgorithm
	var c jwt.Claims
	switch {
	case errors.As(err, &alg):
		reasons.add(fmt.Sprintf("entry %d: JWT alg %s refused: only RS256 is accepted", n, canon.Quote(string(alg.Got))))
	case err != nil:
		reasons.add(fmt.Sprintf("entry %d: not a compact RS256 JWT", n))
	case len(tok.Headers) != 1 || tok.Headers[0].KeyID == "":
		reasons.add(fmt.Sprintf("entry %d: the JWT names no kid", n))
	case tok.UnsafeClaimsWithoutVerification(&c) != nil:
		reasons.add(fmt.Sprintf("entry %d: JWT claims are not a JSON object of registered claims", n))
	default:
		if err = v.checkClaims(c, now); err == nil {
			return jwtEntry{n: n, tok: tok, kid: tok.Headers[0].KeyID}, true
		}
		reasons.add(fmt.Sprintf("entry %d: JWT %v", n, err))
	}
	return jwtEntry{}, false
}

// v1aHeaders checks that the headers a v1a entry signs are there and the
// timestamp within Tolerance of now.
func v1aHeaders(h http.Header, now time.Time) error {
	id, ts := h.Get(HeaderID), h.Get(HeaderTimestamp)
	if id == "" || ts == "" {
		return errors.New("missing webhook-id or webhook-timestamp header")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not Unix seconds")
	}
	off := now.Sub(time.Unix(sec, 0))
	if off > Tolerance {
		return fmt.Errorf("webhook-timestamp is more than 5 minutes old (%v)", off.Round(time.Second))
	}
	if -off > Tolerance {
		return fmt.Errorf("webhook-timestamp is more than 5 minutes in the future (%v ahead)", (-off).Round(time.Second))
	}
	return nil
}

// decodeSignature decodes standard base64, padded or not, of exactly an
// Ed25519 signature's length.
func decodeSignature(s string) ([]byte, bool) {
	sig, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		sig, err = base64.RawStdEncoding.DecodeString(s)
	}
	return sig, err == nil && len(sig) == ed25519.SignatureSize
}

// reasonList gathers why entries failed, for one error message.
type reasonList []string

func (r *reasonList) add(s string) { *r = append(*r, s) }

// err wraps kind with the first few reasons.
func (r reasonList) err(kind error) error {
	const show = 4
	if len(r) == 0 {
		return kind
	}
	msg := strings.Join(r[:min(len(r), show)], "; ")
	if len(r) > show {
		msg += fmt.Sprintf("; and %d more", len(r)-show)
	}
	return fmt.Errorf("%w: %s", kind, msg)
}
