package dynamic

import (
	"context"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Limits of the key set cache (spec §6).
const (
	// MinCacheLifetime is the shortest time a fetched key set is kept,
	// whatever Cache-Control says (no-store, max-age=0 or nothing at all):
	// it bounds how often the receiver asks the key server on its own.
	MinCacheLifetime = 5 * time.Minute
	// MaxCacheLifetime is the longest time a fetched key set is kept, so
	// that a key the publisher withdrew stops verifying within a day.
	MaxCacheLifetime = 24 * time.Hour
	// RefetchInterval is the least time between the end of one fetch
	// attempt and the start of the next, whatever requests arrive: an
	// attacker who sends unknown kids or unverifiable v1a signatures makes
	// the receiver fetch at most once per interval.
	RefetchInterval = time.Minute
	// DefaultFetchTimeout bounds one fetch of the key set.
	DefaultFetchTimeout = 10 * time.Second
	// MaxKeySetBytes is the largest key set document read.
	MaxKeySetBytes = 1 << 20
	// MaxEd25519Keys is how many Ed25519 keys of a set are kept: a v1a
	// entry names no key, so each one is tried against all of them, and
	// this bounds the work one request can cause.
	MaxEd25519Keys = 32
	// MinRSABits is the smallest RSA modulus accepted for RS256.
	MinRSABits = 2048
)

// edKey is one Ed25519 key of the set.
type edKey struct {
	kid string
	pub ed25519.PublicKey
}

// keySet is one fetched key set, reduced to the keys this package can use.
type keySet struct {
	ed      []edKey                     // in the set's order
	rsa     map[string][]*rsa.PublicKey // by kid
	expires time.Time                   // by the injected clock
	gen     uint64                      // 1 for the first fetched set, then +1 per fetch
}

// parseKeySet reads a JWKS document and keeps the keys fit for
// verification: Ed25519 public keys (kty OKP, crv Ed25519) for v1a and RSA
// public keys of at least MinRSABits for RS256, each only when its "use" is
// absent or "sig" and its "alg" is absent or names the scheme. Every other
// key (a type go-jose does not know, EC, symmetric, private material, a
// malformed one) is skipped rather than failing the set, as RFC 7517 §5
// asks, so that a key type added to the set later cannot break verification
// with the keys already there. A set with no usable key is an error.
func parseKeySet(doc []byte) (*keySet, int, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, 0, errors.New("the key set is not a JSON Web Key Set")
	}
	ks := &keySet{rsa: map[string][]*rsa.PublicKey{}}
	skipped := 0
	for _, r := range raw.Keys {
		// Private halves, EC and symmetric keys are skipped: nothing here
		// verifies with them, and a symmetric key must never be used as one.
		var k jose.JSONWebKey
		if k.UnmarshalJSON(r) != nil || k.Use != "" && k.Use != "sig" {
			skipped++
			continue
		}
		switch pub := k.Key.(type) {
		case ed25519.PublicKey:
			if slices.Contains([]string{"", string(jose.EdDSA), "Ed25519"}, k.Algorithm) && len(ks.ed) < MaxEd25519Keys {
				ks.ed = append(ks.ed, edKey{kid: k.KeyID, pub: pub})
				continue
			}
		case *rsa.PublicKey:
			if (k.Algorithm == "" || k.Algorithm == string(jose.RS256)) && pub.N.BitLen() >= MinRSABits {
				ks.rsa[k.KeyID] = append(ks.rsa[k.KeyID], pub)
				continue
			}
		}
		skipped++
	}
	if skipped == len(raw.Keys) {
		return nil, skipped, fmt.Errorf("the key set has no usable Ed25519 or RSA signing key (%d keys, all skipped)", len(raw.Keys))
	}
	return ks, skipped, nil
}

// cacheLifetime is how long a key set answered with h may be kept:
// Cache-Control's max-age less the Age a cache in between reports, no-store
// and no-cache counting as zero, clamped to [MinCacheLifetime,
// MaxCacheLifetime]. Without max-age the minimum applies.
func cacheLifetime(h http.Header) time.Duration {
	var ttl time.Duration
	for _, d := range strings.Split(strings.Join(h.Values("Cache-Control"), ","), ",") {
		name, val, _ := strings.Cut(strings.TrimSpace(d), "=")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "no-store", "no-cache":
			return MinCacheLifetime
		case "max-age":
			// An overflow is read as a very long time (RFC 9111 §1.2.2).
			s, err := strconv.ParseUint(strings.Trim(strings.TrimSpace(val), `"`), 10, 64)
			if err == nil || errors.Is(err, strconv.ErrRange) {
				ttl = time.Duration(min(s, uint64(MaxCacheLifetime/time.Second))) * time.Second
			}
		}
	}
	if age, err := strconv.ParseInt(strings.TrimSpace(h.Get("Age")), 10, 64); err == nil && age > 0 {
		ttl -= time.Duration(min(age, int64(MaxCacheLifetime/time.Second))) * time.Second
	}
	return min(max(ttl, MinCacheLifetime), MaxCacheLifetime)
}

// cache holds the last key set fetched and decides when to fetch again.
// Every fetch attempt, whoever asks for it, starts at least RefetchInterval
// after the previous attempt ended; requests that arrive while one runs
// wait for it instead of starting their own. Requests take turns (turn, a
// one-slot channel that a waiting request can give up on), which guards
// the fields below it.
type cache struct {
	url     string
	client  *http.Client
	now     func() time.Time
	log     *slog.Logger
	turn    chan struct{}
	waiters atomic.Int64 // requests waiting for their turn (tests read it)

	set         *keySet   // the last set fetched, nil before the first success
	gen         uint64    // generation of set
	lastAttempt time.Time // when the last fetch attempt ended; zero before the first
	lastErr     error     // how the last attempt failed; nil when it succeeded
}

// get returns the key set to verify with. force asks for a fresh set (a
// JWT names a kid the cached set lacks, or no cached key verifies a v1a);
// a fetch starts only when the cached set is missing or expired, or force
// is set, and RefetchInterval has passed since the last attempt (so a
// request that waited for a fetch never starts another). current reports
// whether the last attempt succeeded, so that a signature the set does not
// verify is known to be bad rather than possibly signed by a key the
// receiver could not fetch. err is set when no usable set is cached.
func (c *cache) get(ctx context.Context, force bool) (ks *keySet, current bool, err error) {
	c.waiters.Add(1)
	select {
	case c.turn <- struct{}{}:
		c.waiters.Add(-1)
	case <-ctx.Done():
		c.waiters.Add(-1)
		return nil, false, ctx.Err()
	}
	defer func() { <-c.turn }()
	now := c.now()
	usable := c.set != nil && now.Before(c.set.expires)
	if (!usable || force) && (c.lastAttempt.IsZero() || now.Sub(c.lastAttempt) >= RefetchInterval) {
		c.attempt(ctx)
		usable = c.set != nil && c.now().Before(c.set.expires)
	}
	switch {
	case usable:
		return c.set, c.lastErr == nil, nil
	case c.lastErr != nil:
		return nil, false, c.lastErr
	}
	return nil, false, fmt.Errorf("the cached key set has expired and the next fetch is not due until %s", c.lastAttempt.Add(RefetchInterval).UTC().Format(time.RFC3339))
}

// attempt runs one fetch, in the caller's turn. A failed fetch keeps the
// cached set.
func (c *cache) attempt(ctx context.Context) {
	ks, skipped, ttl, err := c.fetch(ctx)
	c.lastAttempt, c.lastErr = c.now(), err
	if err != nil {
		c.log.Warn("dynamic webhooks: fetching the key set failed; dynamically signed requests that need it are answered as unavailable",
			"url", c.url, "err", err, "next_attempt_after", RefetchInterval)
		return
	}
	c.log.Info("dynamic webhooks: key set fetched", "url", c.url,
		"ed25519_keys", len(ks.ed), "rsa_kids", len(ks.rsa), "skipped_keys", skipped, "cache_for", ttl)
	c.gen++
	ks.gen, ks.expires = c.gen, c.lastAttempt.Add(ttl)
	c.set = ks
}

// fetch GETs the key set. It runs on a context of its own (the values of
// ctx, not its cancellation, and DefaultFetchTimeout), so that the request
// that happened to start it hanging up does not fail the fetch for the
// others waiting on it.
func (c *cache) fetch(ctx context.Context) (*keySet, int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("key set request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		// A *url.Error: method, URL and cause; the URL is configuration,
		// not a secret.
		return nil, 0, 0, fmt.Errorf("fetching the key set: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, 0, 0, fmt.Errorf("fetching the key set: %s answered %s", c.url, resp.Status)
	}
	doc, err := io.ReadAll(io.LimitReader(resp.Body, MaxKeySetBytes+1))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading the key set from %s: %w", c.url, err)
	}
	if len(doc) > MaxKeySetBytes {
		return nil, 0, 0, fmt.Errorf("the key set at %s is over %d bytes", c.url, MaxKeySetBytes)
	}
	ks, skipped, err := parseKeySet(doc)
	if err != nil {
		return nil, skipped, 0, fmt.Errorf("key set from %s: %w", c.url, err)
	}
	return ks, skipped, cacheLifetime(resp.Header), nil
}
