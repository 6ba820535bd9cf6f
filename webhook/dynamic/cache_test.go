package dynamic_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// TestUnavailableKeySet: when the key set cannot be had, a well-formed,
// timely dynamic request is ErrUnavailable (503, the sender retries),
// never ErrUnverified.
func TestUnavailableKeySet(t *testing.T) {
	keys, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	closed := httptest.NewServer(keys)
	closed.Close() // connection refused from now on
	serve := func(status int, ct, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	failing, failingSrv := served(t, fakejwks.Options{})
	failing.SetFailure(http.StatusInternalServerError)
	cases := map[string]string{
		"connection refused":   closed.URL,
		"500":                  failingSrv.URL,
		"404":                  serve(http.StatusNotFound, "text/plain", "no such page"),
		"not JSON":             serve(http.StatusOK, "text/html", "<html>a captive portal</html>"),
		"an empty key set":     serve(http.StatusOK, "application/json", `{"keys":[]}`),
		"only unusable keys":   serve(http.StatusOK, "application/json", `{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"},{"kty":"EC","crv":"P-256","kid":"e","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}`),
		"over the size limit":  serve(http.StatusOK, "application/json", `{"keys":[],"pad":"`+strings.Repeat("x", dynamic.MaxKeySetBytes)+`"}`),
		"JSON that is no JWKS": serve(http.StatusOK, "application/json", `["keys"]`),
	}
	for name, url := range cases {
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			v := verifier(t, url, clk, "")
			now := clk.Now()
			for scheme, h := range map[string]http.Header{
				"v1a": headers("m", now, keys.SignV1a("m", now, testBody)),
				"JWT": headers("", time.Time{}, keys.SignJWT("m", now, testBody)),
			} {
				_, err := verify(v, testBody, h)
				if !errors.Is(err, dynamic.ErrUnavailable) || errors.Is(err, dynamic.ErrUnverified) {
					t.Errorf("Verify(%s) = %v, want ErrUnavailable (503)", scheme, err)
				} else {
					assertNoSecretsIn(t, err, h, keys)
				}
			}
			if err := v.Ready(context.Background()); !errors.Is(err, dynamic.ErrUnavailable) {
				t.Errorf("Ready = %v, want ErrUnavailable", err)
			}
		})
	}
	if n := failing.Fetches(); n != 1 {
		t.Errorf("a failing key server was asked %d times within a minute, want 1", n)
	}
}

// TestUnavailableThenRecovered: a failed fetch is retried no sooner than
// a minute later, and then verification works.
func TestUnavailableThenRecovered(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	keys.SetFailure(http.StatusServiceUnavailable)
	var logs testkit.Buffer
	v, err := dynamic.New(dynamic.Config{JWKSURL: srv.URL, Now: clk.Now, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sign := func() http.Header {
		now := clk.Now()
		return headers("m", now, keys.SignV1a("m", now, testBody))
	}
	for range 100 {
		clk.Advance(500 * time.Millisecond)
		if _, err := verify(v, testBody, sign()); !errors.Is(err, dynamic.ErrUnavailable) {
			t.Fatalf("Verify during the outage = %v, want ErrUnavailable", err)
		}
	}
	if n := keys.Fetches(); n != 1 {
		t.Fatalf("key server asked %d times during 50 s of outage, want 1", n)
	}
	keys.SetFailure(0)
	clk.Advance(9500 * time.Millisecond) // 59 s after the failed attempt, made at 0.5 s
	if _, err := verify(v, testBody, sign()); !errors.Is(err, dynamic.ErrUnavailable) {
		t.Fatalf("Verify 59 s after the failed fetch = %v, want ErrUnavailable (no refetch yet)", err)
	}
	clk.Advance(time.Second)
	if _, err := verify(v, testBody, sign()); err != nil {
		t.Fatalf("Verify a minute after the failed fetch, server back = %v, want nil", err)
	}
	if n := keys.Fetches(); n != 2 {
		t.Errorf("key server asked %d times, want 2", n)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "503") ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "ed25519_keys=1") {
		t.Errorf("log = %q, want one warning for the failed fetch and one info line for the good one", lines)
	}
	if err := v.Ready(context.Background()); err != nil {
		t.Errorf("Ready = %v, want nil", err)
	}
}

// TestFailedRefreshIsUnavailable: with a cached set still in its
// lifetime, a request its keys verify passes while the key server is
// down; one that might be signed by a newer key (an unknown kid, a v1a no
// cached key verifies) is ErrUnavailable, since the refresh that could
// tell failed; once the set's lifetime is over, every dynamic request is
// ErrUnavailable until the server is back.
func TestFailedRefreshIsUnavailable(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	good := func() http.Header {
		now := clk.Now()
		return headers("m", now, keys.SignJWT("m", now, testBody))
	}
	if _, err := verify(v, testBody, good()); err != nil {
		t.Fatal(err)
	}
	firstKey, firstKid := keys.RSAPrivateKey(), keys.RSAKeyID()
	keys.SetFailure(http.StatusBadGateway)
	if err := keys.Rotate(); err != nil { // new keys the receiver cannot see
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	now := clk.Now()
	newJWT := headers("m", now, keys.SignJWT("m", now, testBody))
	if _, err := verify(v, testBody, newJWT); !errors.Is(err, dynamic.ErrUnavailable) {
		t.Errorf("Verify(JWT of an unknown kid, refresh failing) = %v, want ErrUnavailable", err)
	}
	newV1a := headers("m", now, keys.SignV1a("m", now, testBody))
	if _, err := verify(v, testBody, newV1a); !errors.Is(err, dynamic.ErrUnavailable) {
		t.Errorf("Verify(v1a by a new key, refresh failing) = %v, want ErrUnavailable", err)
	}
	// The old key is still in the cached set, within its hour.
	if _, err := verify(v, testBody, headers("", time.Time{}, fakejwks.SignRS256(firstKey, firstKid, now))); err != nil {
		t.Errorf("Verify(JWT by a cached key, server down) = %v, want nil", err)
	}
	// An hour after the fetch, the set is expired and the server still down.
	clk.Advance(time.Hour)
	if _, err := verify(v, testBody, headers("", time.Time{}, fakejwks.SignRS256(firstKey, firstKid, clk.Now()))); !errors.Is(err, dynamic.ErrUnavailable) {
		t.Errorf("Verify after the set expired, server down = %v, want ErrUnavailable", err)
	}
	keys.SetFailure(0)
	clk.Advance(time.Minute)
	now = clk.Now()
	if _, err := verify(v, testBody, headers("m", now, keys.SignV1a("m", now, testBody))); err != nil {
		t.Errorf("Verify(v1a by the new key, server back) = %v, want nil", err)
	}
}

// TestUnknownKidFloodIsBounded: 1,000 requests with random unknown kids
// (and as many v1a signatures no key verifies), from 8 goroutines over
// 100 s of clock, make the receiver fetch the key set at most once a
// minute: once at the start and once more after a minute.
func TestUnknownKidFloodIsBounded(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	const requests, workers = 1000, 8
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < requests; i += workers {
				now := clk.Advance(100 * time.Millisecond)
				var h http.Header
				// Signatures of random bytes: what is looked at first is
				// the kid (or, for v1a, every key), and a forger need not
				// sign anything.
				if i%2 == 0 {
					tok := fakejwks.RawJWT(map[string]any{"alg": "RS256", "kid": rand.Text()},
						map[string]any{"iat": now.Unix(), "exp": now.Unix() + 60}, func([]byte) []byte { return randomBytes(256) })
					h = headers("", time.Time{}, tok)
				} else {
					h = headers("m", now, "v1a,"+base64.StdEncoding.EncodeToString(randomBytes(64)))
				}
				if _, err := v.Verify(context.Background(), testBody, h); !errors.Is(err, dynamic.ErrUnverified) {
					errs <- fmt.Errorf("request %d: Verify = %v, want ErrUnverified", i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := keys.Fetches(); n < 2 || n > 3 {
		t.Errorf("1,000 unverifiable requests over 100 s made %d key set fetches, want 2 (the first, one refresh after a minute)", n)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// TestCacheHonoursCacheControl: a set is kept for its Cache-Control
// lifetime, clamped to [5 min, 24 h]: a good request just before the end
// causes no fetch, one just after does.
func TestCacheHonoursCacheControl(t *testing.T) {
	cases := []struct {
		cacheControl string
		age          string
		lifetime     time.Duration
	}{
		{"public, max-age=3600", "", time.Hour},
		{"max-age=600, must-revalidate", "", 10 * time.Minute},
		{"max-age=60", "", dynamic.MinCacheLifetime},
		{"max-age=0", "", dynamic.MinCacheLifetime},
		{"no-store", "", dynamic.MinCacheLifetime},
		{"no-cache, max-age=3600", "", dynamic.MinCacheLifetime},
		{"-", "", dynamic.MinCacheLifetime}, // no Cache-Control at all
		{"max-age=banana", "", dynamic.MinCacheLifetime},
		{"public, max-age=172800", "", dynamic.MaxCacheLifetime},
		{"max-age=99999999999999999999", "", dynamic.MaxCacheLifetime}, // past int64: still "very long"
		{"Public, MAX-AGE=7200", "", 2 * time.Hour},
		{"public, max-age=3600", "600", 50 * time.Minute}, // a cache in between held it 10 min
		{"public, max-age=3600", "3500", dynamic.MinCacheLifetime},
	}
	keys, err := fakejwks.New(fakejwks.Options{}) // one key pair for all: RSA keys are slow to make
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.cacheControl+" age "+c.age, func(t *testing.T) {
			clk := newClock()
			keys.SetCacheControl(c.cacheControl)
			fetches := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fetches++ // one verifier, whose fetches never overlap
				if c.age != "" {
					w.Header().Set("Age", c.age)
				}
				keys.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			v := verifier(t, srv.URL, clk, "")
			good := func() http.Header {
				now := clk.Now()
				return headers("m", now, keys.SignV1a("m", now, testBody))
			}
			if _, err := verify(v, testBody, good()); err != nil {
				t.Fatal(err)
			}
			clk.Advance(c.lifetime - time.Second)
			if _, err := verify(v, testBody, good()); err != nil {
				t.Fatal(err)
			}
			if n := fetches; n != 1 {
				t.Fatalf("fetches 1 s before the %v lifetime ends = %d, want 1", c.lifetime, n)
			}
			clk.Advance(time.Second)
			if _, err := verify(v, testBody, good()); err != nil {
				t.Fatal(err)
			}
			if n := fetches; n != 2 {
				t.Fatalf("fetches when the %v lifetime ends = %d, want 2", c.lifetime, n)
			}
		})
	}
}

// TestRotatedKeyFetchedWithinAMinute: a delivery by a key published
// after the set was fetched is refused until a minute has passed since
// the fetch (the refetch limit), then accepted after one refetch.
func TestRotatedKeyFetchedWithinAMinute(t *testing.T) {
	for _, scheme := range []dynamic.Scheme{dynamic.SchemeV1a, dynamic.SchemeJWT} {
		t.Run(string(scheme), func(t *testing.T) {
			clk := newClock()
			keys, srv := served(t, fakejwks.Options{})
			v := verifier(t, srv.URL, clk, "")
			if err := v.Ready(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := keys.Rotate(); err != nil {
				t.Fatal(err)
			}
			sign := func() http.Header {
				now := clk.Now()
				if scheme == dynamic.SchemeV1a {
					return headers("m", now, keys.SignV1a("m", now, testBody))
				}
				return headers("", time.Time{}, keys.SignJWT("m", now, testBody))
			}
			clk.Advance(30 * time.Second)
			if _, err := verify(v, testBody, sign()); !errors.Is(err, dynamic.ErrUnverified) {
				t.Fatalf("Verify(new key, 30 s after the fetch) = %v, want ErrUnverified", err)
			}
			clk.Advance(30 * time.Second)
			res, err := verify(v, testBody, sign())
			if err != nil || res.Scheme != scheme {
				t.Fatalf("Verify(new key, a minute after the fetch) = %+v, %v; want %s", res, err, scheme)
			}
			if n := keys.Fetches(); n != 2 {
				t.Errorf("fetches = %d, want 2", n)
			}
		})
	}
}
