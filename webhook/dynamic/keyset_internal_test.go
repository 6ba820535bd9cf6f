package dynamic

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
)

// TestConcurrentRequestsShareOneFetch holds the key server's answer
// until every request is waiting on the one fetch in flight, then
// releases it: one fetch serves them all. The request that started the
// fetch is cancelled meanwhile, and the fetch goes on for the others; a
// waiter whose own context ends gives up as unavailable.
func TestConcurrentRequestsShareOneFetch(t *testing.T) {
	keys, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var arrived atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
		keys.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	v, err := New(Config{JWKSURL: srv.URL, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"batch.succeeded","data":{"id":"batches/1"}}`)
	h := http.Header{}
	h.Set(HeaderID, "m")
	h.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(HeaderSignature, keys.SignV1a("m", now, body))

	type answer struct {
		res Result
		err error
	}
	// The first request starts the fetch, then its client goes away.
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	first := make(chan answer, 1)
	go func() {
		res, err := v.Verify(firstCtx, body, h)
		first <- answer{res, err}
	}()
	waitFor(t, "the fetch to reach the key server", func() bool { return arrived.Load() == 1 })
	cancelFirst()

	const others = 20
	answers := make(chan answer, others)
	for range others {
		go func() {
			res, err := v.Verify(context.Background(), body, h)
			answers <- answer{res, err}
		}()
	}
	quitterCtx, quit := context.WithCancel(context.Background())
	quitter := make(chan error, 1)
	go func() {
		_, err := v.Verify(quitterCtx, body, h)
		quitter <- err
	}()
	waitFor(t, "every request to wait on the fetch", func() bool {
		return v.keys.waiters.Load() == others+1
	})
	quit()
	if err := <-quitter; !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("Verify of a request that gave up waiting = %v, want ErrUnavailable (context canceled)", err)
	}
	close(release)
	for range others {
		if a := <-answers; a.err != nil || a.res.Scheme != SchemeV1a {
			t.Errorf("Verify of a waiting request = %+v, %v; want v1a", a.res, a.err)
		}
	}
	if a := <-first; a.err != nil {
		t.Errorf("Verify of the request that started the fetch = %v, want nil (the fetch is not cancelled with it)", a.err)
	}
	if n := keys.Fetches(); n != 1 {
		t.Errorf("%d concurrent requests made %d fetches, want 1", others+2, n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestParseKeySet: usable keys are kept, everything else is skipped
// without failing the set; a set with nothing usable is an error.
func TestParseKeySet(t *testing.T) {
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	smallRSA, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwk := func(k jose.JSONWebKey) json.RawMessage {
		b, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keys := []json.RawMessage{
		jwk(jose.JSONWebKey{Key: edPub, KeyID: "ed-ok", Use: "sig", Algorithm: "EdDSA"}),
		jwk(jose.JSONWebKey{Key: edPub, KeyID: "ed-no-alg"}),
		jwk(jose.JSONWebKey{Key: edPub, KeyID: "ed-enc", Use: "enc"}),
		jwk(jose.JSONWebKey{Key: edPub, KeyID: "ed-wrong-alg", Algorithm: "RS256"}),
		jwk(jose.JSONWebKey{Key: edPriv, KeyID: "ed-private"}),
		jwk(jose.JSONWebKey{Key: &rsaKey.PublicKey, KeyID: "rsa-ok", Use: "sig", Algorithm: "RS256"}),
		jwk(jose.JSONWebKey{Key: &rsaKey.PublicKey, KeyID: "rsa-ps256", Algorithm: "PS256"}),
		jwk(jose.JSONWebKey{Key: rsaKey, KeyID: "rsa-private"}),
		jwk(jose.JSONWebKey{Key: &smallRSA.PublicKey, KeyID: "rsa-1024"}),
		jwk(jose.JSONWebKey{Key: &ecKey.PublicKey, KeyID: "ec"}),
		jwk(jose.JSONWebKey{Key: []byte("a shared secret of some length"), KeyID: "oct"}),
		json.RawMessage(`{"kty":"OKP","crv":"X25519","kid":"x25519","x":"hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo"}`),
		json.RawMessage(`{"kty":"OKP","crv":"Ed25519","kid":"ed-low-order","x":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}`),
		json.RawMessage(`{"kty":"ML-DSA-of-the-future","kid":"new"}`),
		json.RawMessage(`{"kid":"no-kty"}`),
		json.RawMessage(`"not an object"`),
	}
	doc, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	ks, skipped, err := parseKeySet(doc)
	if err != nil {
		t.Fatal(err)
	}
	var edKids []string
	for _, k := range ks.ed {
		edKids = append(edKids, k.kid)
	}
	if got := strings.Join(edKids, ","); got != "ed-ok,ed-no-alg" {
		t.Errorf("Ed25519 keys kept = %s, want ed-ok,ed-no-alg", got)
	}
	if len(ks.rsa) != 1 || len(ks.rsa["rsa-ok"]) != 1 {
		t.Errorf("RSA keys kept = %v, want rsa-ok only", ks.rsa)
	}
	if want := len(keys) - 3; skipped != want {
		t.Errorf("skipped = %d, want %d", skipped, want)
	}

	for name, doc := range map[string]string{
		"no keys":       `{"keys":[]}`,
		"no keys field": `{}`,
		"only skipped":  `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`,
		"not JSON":      `<html>`,
		"keys not list": `{"keys":{"kty":"RSA"}}`,
	} {
		if _, _, err := parseKeySet([]byte(doc)); err == nil {
			t.Errorf("parseKeySet(%s) = nil error, want one", name)
		}
	}
}

// TestEd25519KeysBounded: a set with more Ed25519 keys than
// MaxEd25519Keys keeps the first MaxEd25519Keys.
func TestEd25519KeysBounded(t *testing.T) {
	var set jose.JSONWebKeySet
	for i := range MaxEd25519Keys + 5 {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub, KeyID: strconv.Itoa(i)})
	}
	doc, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	ks, skipped, err := parseKeySet(doc)
	if err != nil || len(ks.ed) != MaxEd25519Keys || skipped != 5 {
		t.Fatalf("parseKeySet(%d Ed25519 keys) = %d kept, %d skipped, %v; want %d, 5", MaxEd25519Keys+5, len(ks.ed), skipped, err, MaxEd25519Keys)
	}
}
