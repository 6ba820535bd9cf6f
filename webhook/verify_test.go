package webhook

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The Standard Webhooks reference vector. Source: the specification's own
// repository, github.com/standard-webhooks/standard-webhooks,
// libraries/python/tests/test_webhooks.py, test_sign_function (commit
// 33d368b20c5543357f4f27fd13bed0703b8c5204); the same vector is
// TestWebhookSign in svix/svix-webhooks go/webhook_test.go. Its invalid
// counterpart (last character changed) is test_invalid_signature_raises_error
// in the same file.
const (
	vecSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vecID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vecTimestamp = 1614265330
	vecPayload   = `{"test": 2432232314}`
	vecSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	vecBadSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
)

// Two more valid secrets (32 random bytes each) for rotation tests.
const (
	secretA = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	secretB = "whsec_ZmFrZS1zZWNyZXQtZm9yLXRlc3RzLW9ubHktMzJieXRlcw=="
)

func vecHeader(sig string, ts int64) http.Header {
	h := http.Header{}
	h.Set("webhook-id", vecID)
	h.Set("webhook-timestamp", itoa(ts))
	h.Set("webhook-signature", sig)
	return h
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestReferenceVectorLibrary(t *testing.T) {
	wh, err := standardwebhooks.NewWebhook(vecSecret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wh.Sign(vecID, time.Unix(vecTimestamp, 0), []byte(vecPayload))
	if err != nil || got != vecSignature {
		t.Fatalf("Sign(vector) = %q, %v, want %q", got, err, vecSignature)
	}
	if err := wh.VerifyIgnoringTimestamp([]byte(vecPayload), vecHeader(vecSignature, vecTimestamp)); err != nil {
		t.Errorf("library VerifyIgnoringTimestamp(vector) = %v, want nil", err)
	}
	// The library's own clock makes the 2021 vector stale.
	if err := wh.Verify([]byte(vecPayload), vecHeader(vecSignature, vecTimestamp)); !errors.Is(err, standardwebhooks.ErrMessageTooOld) {
		t.Errorf("library Verify(vector) = %v, want ErrMessageTooOld", err)
	}
}

func TestReferenceVectorVerifier(t *testing.T) {
	at := time.Unix(vecTimestamp, 0)
	tests := []struct {
		name    string
		secrets []string
		body    string
		header  http.Header
		now     time.Time
		want    error
	}{
		{"vector", []string{vecSecret}, vecPayload, vecHeader(vecSignature, vecTimestamp), at, nil},
		{"vector among rotated secrets", []string{secretA, vecSecret}, vecPayload, vecHeader(vecSignature, vecTimestamp), at, nil},
		{"vector one signature of several", []string{vecSecret}, vecPayload,
			vecHeader("v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,x "+vecSignature, vecTimestamp), at, nil},
		{"invalid vector", []string{vecSecret}, vecPayload, vecHeader(vecBadSig, vecTimestamp), at, ErrBadSignature},
		{"tampered body", []string{vecSecret}, `{"test": 2432232315}`, vecHeader(vecSignature, vecTimestamp), at, ErrBadSignature},
		{"rotated-out secret", []string{secretA, secretB}, vecPayload, vecHeader(vecSignature, vecTimestamp), at, ErrBadSignature},
		{"v1a is not v1", []string{vecSecret}, vecPayload, vecHeader("v1a,"+vecSignature[3:], vecTimestamp), at, ErrBadSignature},
		{"stale by 5m1s", []string{vecSecret}, vecPayload, vecHeader(vecSignature, vecTimestamp), at.Add(Tolerance + time.Second), ErrStale},
		{"old by exactly 5m", []string{vecSecret}, vecPayload, vecHeader(vecSignature, vecTimestamp), at.Add(Tolerance), nil},
		{"future by 5m1s", []string{vecSecret}, vecPayload, vecHeader(vecSignature, vecTimestamp), at.Add(-Tolerance - time.Second), ErrFuture},
		{"no signature header", []string{vecSecret}, vecPayload, vecHeader("", vecTimestamp), at, ErrUnsigned},
		{"timestamp not a number", []string{vecSecret}, vecPayload, func() http.Header {
			h := vecHeader(vecSignature, vecTimestamp)
			h.Set("webhook-timestamp", "2021-02-25")
			return h
		}(), at, ErrBadTimestamp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := NewVerifier(tt.secrets, func() time.Time { return tt.now })
			if err != nil {
				t.Fatal(err)
			}
			if got := v.Verify([]byte(tt.body), tt.header); !errors.Is(got, tt.want) {
				t.Errorf("Verify(%q) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestValidateSecret(t *testing.T) {
	tests := []struct {
		secret string
		ok     bool
	}{
		{vecSecret, true},
		{secretA, true},
		{secretB, true},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false},      // no prefix
		{"whsec_not*base64*at*all!!!!!!!!!!!", false},    // not base64
		{"whsec_c2hvcnQ=", false},                        // 5 bytes
		{"whsec_", false},                                // empty
		{"whpk_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false}, // a public key prefix
	}
	for _, tt := range tests {
		err := ValidateSecret(tt.secret)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateSecret(%q) = %v, want ok=%v", tt.secret, err, tt.ok)
		}
		if err != nil && strings.Contains(err.Error(), strings.TrimPrefix(tt.secret, "whsec_")) && len(tt.secret) > 6 {
			t.Errorf("ValidateSecret(%q) error %q contains the secret", tt.secret, err)
		}
	}
}

func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secrets")
	if err := os.WriteFile(file, []byte("# current\n"+secretB+"\n\n  # old, until Friday\n"+vecSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	const leaked = "whsec_thisIsNotBase64!!andMustNotLeak"
	if err := os.WriteFile(bad, []byte(secretA+"\n"+leaked+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     string
		file    string
		want    []string
		wantErr string
	}{
		{"nothing", "", "", nil, ""},
		{"env space separated", secretA + " " + vecSecret, "", []string{secretA, vecSecret}, ""},
		{"env comma separated", secretA + ", " + vecSecret + ",", "", []string{secretA, vecSecret}, ""},
		{"file with comments", "", file, []string{secretB, vecSecret}, ""},
		{"env then file, no repeats", vecSecret + "," + secretA, file, []string{vecSecret, secretA, secretB}, ""},
		{"bad env item", secretA + " " + leaked, "", nil, SecretEnv + " (item 2)"},
		{"bad file line", "", bad, nil, bad + " line 2"},
		{"missing file", "", filepath.Join(dir, "nope"), nil, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadSecrets(tt.env, tt.file)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadSecrets(%q, %q) error = %v, want one containing %q", tt.env, tt.file, err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "thisIsNotBase64") {
					t.Errorf("LoadSecrets(%q, %q) error %q contains the secret", tt.env, tt.file, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadSecrets(%q, %q) = %v", tt.env, tt.file, err)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("LoadSecrets(%q, %q) = %q, want %q", tt.env, tt.file, got, tt.want)
			}
		})
	}
}

func TestNewVerifierErrorsOmitSecret(t *testing.T) {
	const s = "whsec_AAAA"
	_, err := NewVerifier([]string{vecSecret, s}, nil)
	if err == nil || !strings.Contains(err.Error(), "#2") || strings.Contains(err.Error(), "AAAA") {
		t.Errorf("NewVerifier(short secret) = %v, want an error naming #2 without the secret", err)
	}
	if _, err := NewVerifier(nil, nil); err == nil {
		t.Errorf("NewVerifier(nil) = nil error, want one")
	}
}

// TestSignatureHeaderLines: every webhook-signature header line and every
// space-separated entry in each is considered (spec §6), not only the first
// line.
func TestSignatureHeaderLines(t *testing.T) {
	at := time.Unix(vecTimestamp, 0)
	other := "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
	lines := func(sigs ...string) http.Header {
		h := vecHeader("", vecTimestamp)
		h.Del("webhook-signature")
		for _, s := range sigs {
			h.Add("webhook-signature", s)
		}
		return h
	}
	tests := []struct {
		name   string
		header http.Header
		want   error
	}{
		{"valid on the second of two lines", lines(other, vecSignature), nil},
		{"valid on the third line", lines(other, "v2,xyz", vecSignature), nil},
		{"valid among entries of the second line", lines(other, "v1a,abc "+vecSignature+" v1,zzz"), nil},
		{"first line empty", lines("", vecSignature), nil},
		{"lines joined by a proxy with a comma", lines(other + ", " + vecSignature), nil},
		{"extra spaces and tabs", lines("  " + other + " \t " + vecSignature + "  "), nil},
		{"no line valid", lines(other, vecBadSig), ErrBadSignature},
		{"only empty lines", lines("", " "), ErrUnsigned},
	}
	v, err := NewVerifier([]string{vecSecret}, func() time.Time { return at })
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if got := v.Verify([]byte(vecPayload), tt.header); !errors.Is(got, tt.want) {
			t.Errorf("Verify(%s: %q) = %v, want %v", tt.name, tt.header.Values("webhook-signature"), got, tt.want)
		}
	}
}
