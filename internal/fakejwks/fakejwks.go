// Package fakejwks stands in for the Gemini API's dynamic webhook signing
// (spec §6; the local emulator will sign with it): it generates Ed25519 and RSA keys, serves their public
// halves as a JWKS over HTTP (with a Cache-Control header, a fetch counter
// and an outage switch), and signs deliveries both ways the Gemini API is
// documented or reported to: a Standard Webhooks `v1a` entry (Ed25519 over
// id.timestamp.body) and an RS256 JWT with kid, iat and exp.
//
// It is for tests and the local emulator only, which is why it lives
// under internal/ rather than in package webhook/dynamic: the verifier
// ships in the receiver, private keys and a key server do not.
package fakejwks

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Signer signs one delivery: it returns the value of its
// webhook-signature header. The emulator's delivery engine takes one.
type Signer interface {
	Sign(id string, ts time.Time, body []byte) string
}

// SignerFunc makes a method value such as keys.SignJWT a Signer.
type SignerFunc func(id string, ts time.Time, body []byte) string

// Sign calls f.
func (f SignerFunc) Sign(id string, ts time.Time, body []byte) string { return f(id, ts, body) }

// DefaultCacheControl is what the JWKS is served with unless told
// otherwise.
const DefaultCacheControl = "public, max-age=3600"

// DefaultJWTLifetime is exp − iat of the JWTs signed.
const DefaultJWTLifetime = 5 * time.Minute

// Options configures New. The zero value is one Ed25519 and one RSA key.
type Options struct {
	// Ed25519Keys is how many Ed25519 keys the set publishes (default 1);
	// v1a signatures are made with the last, so that a verifier must try
	// them all.
	Ed25519Keys int
	// Audience is the aud claim of the JWTs; "" leaves it out.
	Audience string
	// JWTLifetime is exp − iat; 0 means DefaultJWTLifetime.
	JWTLifetime time.Duration
	// CacheControl is the Cache-Control of JWKS answers; "" means
	// DefaultCacheControl (SetCacheControl changes it later).
	CacheControl string
}

type edKey struct {
	kid  string
	priv ed25519.PrivateKey
}

type rsaKey struct {
	kid    string
	priv   *rsa.PrivateKey
	signer jose.Signer
}

// Keys is a fake key server and signer. It is an http.Handler that serves
// the JWKS on GET at any path; mount it where the emulator publishes it.
// Safe for concurrent use.
type Keys struct {
	audience string
	lifetime time.Duration

	mu           sync.Mutex
	ed           []edKey  // published; the last signs v1a
	rsa          []rsaKey // published; the last signs JWTs
	next         int      // numbers the kids
	cacheControl string
	failStatus   int // when not 0, JWKS requests get this status
	fetches      int
}

// New generates the keys.
func New(opts Options) (*Keys, error) {
	k := &Keys{
		audience:     opts.Audience,
		lifetime:     opts.JWTLifetime,
		cacheControl: opts.CacheControl,
	}
	if k.lifetime <= 0 {
		k.lifetime = DefaultJWTLifetime
	}
	if k.cacheControl == "" {
		k.cacheControl = DefaultCacheControl
	}
	n := max(opts.Ed25519Keys, 1)
	for range n {
		if err := k.addEd25519(); err != nil {
			return nil, err
		}
	}
	if err := k.addRSA(); err != nil {
		return nil, err
	}
	return k, nil
}

// kid names a new key: numbered within the set and random across sets,
// so that two fake key servers never publish the same kid.
func (k *Keys) kid(kind string) string {
	k.next++
	return fmt.Sprintf("fake-%s-%d-%s", kind, k.next, rand.Text()[:8])
}

func (k *Keys) addEd25519() error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("fakejwks: Ed25519 key: %w", err)
	}
	k.ed = append(k.ed, edKey{kid: k.kid("ed25519"), priv: priv})
	return nil
}

func (k *Keys) addRSA() error {
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("fakejwks: RSA key: %w", err)
	}
	kid := k.kid("rsa")
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: priv, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return fmt.Errorf("fakejwks: RS256 signer: %w", err)
	}
	k.rsa = append(k.rsa, rsaKey{kid: kid, priv: priv, signer: signer})
	return nil
}

// Rotate publishes a new Ed25519 and a new RSA key beside the old ones
// and signs with the new ones from now on, as a key server rotating keys
// does.
func (k *Keys) Rotate() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.addEd25519(); err != nil {
		return err
	}
	return k.addRSA()
}

// JWKS is the published key set: every key's public half, with kid, use
// "sig" and alg (EdDSA or RS256).
func (k *Keys) JWKS() []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	var set jose.JSONWebKeySet
	for _, e := range k.ed {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: e.priv.Public(), KeyID: e.kid, Use: "sig", Algorithm: string(jose.EdDSA)})
	}
	for _, r := range k.rsa {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: r.priv.Public(), KeyID: r.kid, Use: "sig", Algorithm: string(jose.RS256)})
	}
	doc, err := json.Marshal(set)
	if err != nil {
		panic("fakejwks: marshalling public keys: " + err.Error()) // keys New made always marshal
	}
	return doc
}

// ServeHTTP answers GET (and HEAD) with the JWKS and the Cache-Control
// header, or with the status SetFailure set; every request is counted.
func (k *Keys) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	k.fetches++
	fail, cc := k.failStatus, k.cacheControl
	k.mu.Unlock()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if fail != 0 {
		http.Error(w, "key set unavailable (fakejwks outage)", fail)
		return
	}
	doc := k.JWKS()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(doc)))
	if cc != "-" {
		w.Header().Set("Cache-Control", cc)
	}
	if r.Method == http.MethodGet {
		_, _ = w.Write(doc)
	}
}

// Fetches is how many requests the key server has answered.
func (k *Keys) Fetches() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetches
}

// SetCacheControl sets the Cache-Control of later answers; "-" sends
// none.
func (k *Keys) SetCacheControl(v string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cacheControl = v
}

// SetFailure makes later JWKS requests answer status (say 503); 0 serves
// the set again.
func (k *Keys) SetFailure(status int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failStatus = status
}

// Ed25519KeyIDs are the kids of the published Ed25519 keys, the signing
// one last.
func (k *Keys) Ed25519KeyIDs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := make([]string, len(k.ed))
	for i, e := range k.ed {
		ids[i] = e.kid
	}
	return ids
}

// RSAKeyID is the kid of the RSA key that signs JWTs.
func (k *Keys) RSAKeyID() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rsa[len(k.rsa)-1].kid
}

// RSAPrivateKey is the RSA key that signs JWTs: tests use it to sign
// tokens a verifier must refuse (another algorithm with the right key).
func (k *Keys) RSAPrivateKey() *rsa.PrivateKey {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rsa[len(k.rsa)-1].priv
}

// Sign signs a delivery both ways: a v1a entry and a JWT, space
// separated, as one webhook-signature value.
func (k *Keys) Sign(id string, ts time.Time, body []byte) string {
	return k.SignV1a(id, ts, body) + " " + k.SignJWT(id, ts, body)
}

// SignV1a returns a Standard Webhooks v1a entry: "v1a," and the standard
// base64 of the Ed25519 signature of id "." unix-seconds(ts) "." body,
// made with the last Ed25519 key. The webhook-timestamp header must carry
// ts in Unix seconds.
func (k *Keys) SignV1a(id string, ts time.Time, body []byte) string {
	k.mu.Lock()
	priv := k.ed[len(k.ed)-1].priv
	k.mu.Unlock()
	msg := make([]byte, 0, len(id)+len(body)+24)
	msg = append(msg, id...)
	msg = append(msg, '.')
	msg = strconv.AppendInt(msg, ts.Unix(), 10)
	msg = append(msg, '.')
	msg = append(msg, body...)
	return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, msg))
}

// SignJWT returns an RS256 JWT (header kid and typ JWT; claims iat = ts,
// exp = ts + JWTLifetime, aud when configured) as the whole
// webhook-signature value. Like the Gemini API's guide describes it, it
// binds neither id nor body; they are taken only to fit Signer.
func (k *Keys) SignJWT(_ string, ts time.Time, _ []byte) string {
	c := jwt.Claims{
		IssuedAt: jwt.NewNumericDate(ts),
		Expiry:   jwt.NewNumericDate(ts.Add(k.lifetime)),
	}
	if k.audience != "" {
		c.Audience = jwt.Audience{k.audience}
	}
	return k.SignClaims(c)
}

// SignClaims signs any claims (a jwt.Claims, a map, a struct) as an RS256
// JWT with the signing RSA key's kid: for tests of the claim rules.
func (k *Keys) SignClaims(claims any) string {
	k.mu.Lock()
	signer := k.rsa[len(k.rsa)-1].signer
	k.mu.Unlock()
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		// Only claims that do not marshal to a JSON object fail here: a
		// caller's bug, not a condition to handle.
		panic("fakejwks: signing a JWT: " + strings.TrimPrefix(err.Error(), "go-jose/go-jose: "))
	}
	return tok
}

// Forgeries, for tests of what a verifier refuses.

// RawJWT builds a compact JWS by hand: header and claims as given, the
// signature from sign over the signing input (nil: an empty signature).
func RawJWT(header, claims map[string]any, sign func(input []byte) []byte) string {
	hb, err := json.Marshal(header)
	if err == nil {
		var cb []byte
		if cb, err = json.Marshal(claims); err == nil {
			input := base64.RawURLEncoding.EncodeToString(hb) + "." + base64.RawURLEncoding.EncodeToString(cb)
			var sig []byte
			if sign != nil {
				sig = sign([]byte(input))
			}
			return input + "." + base64.RawURLEncoding.EncodeToString(sig)
		}
	}
	// Only values that do not marshal fail here: a caller's bug.
	panic("fakejwks: RawJWT: " + err.Error())
}

// HS256 returns a RawJWT signature function: HMAC-SHA256 keyed with secret.
func HS256(secret []byte) func(input []byte) []byte {
	return func(input []byte) []byte {
		m := hmac.New(sha256.New, secret)
		m.Write(input)
		return m.Sum(nil)
	}
}

// SignRS256 signs a live JWT (iat now, exp a minute later) with any RSA
// key under any kid: a key set's own, another's, or none published.
func SignRS256(key *rsa.PrivateKey, kid string, now time.Time) string {
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err == nil {
		var tok string
		if tok, err = jwt.Signed(s).Claims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute))}).Serialize(); err == nil {
			return tok
		}
	}
	panic("fakejwks: SignRS256: " + err.Error())
}
