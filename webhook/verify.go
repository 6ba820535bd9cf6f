package webhook

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// SecretEnv is the environment variable that holds webhook secrets
// (whitespace or comma separated, for rotation).
const SecretEnv = "GEMRECON_WEBHOOK_SECRET"

// Tolerance is how far a webhook-timestamp may lie from the receiver's clock,
// either way: the Standard Webhooks library's own five minutes.
const Tolerance = 5 * time.Minute

// MinSecretBytes is the shortest decoded secret accepted: the Standard
// Webhooks specification asks for at least 24 random bytes.
const MinSecretBytes = 24

const secretPrefix = "whsec_"

// Errors of verification. They name what failed, never a secret.
var (
	// ErrUnsigned: a webhook-id, webhook-timestamp or webhook-signature header is missing.
	ErrUnsigned = errors.New("missing webhook-id, webhook-timestamp or webhook-signature header")
	// ErrBadTimestamp: webhook-timestamp is not an integer of Unix seconds.
	ErrBadTimestamp = errors.New("webhook-timestamp is not Unix seconds")
	// ErrStale: webhook-timestamp is more than Tolerance before now.
	ErrStale = errors.New("webhook-timestamp is too old")
	// ErrFuture: webhook-timestamp is more than Tolerance after now.
	ErrFuture = errors.New("webhook-timestamp is in the future")
	// ErrBadSignature: no v1 signature matches any configured secret.
	ErrBadSignature = errors.New("no webhook-signature matches a configured secret")
)

// Verifier checks Standard Webhooks signatures against several secrets: a
// request passes if any secret verifies it, which is how a sender rotates
// secrets without downtime. The HMAC and its constant-time comparison are
// the standardwebhooks library's; the timestamp window is checked here
// against an injectable clock, with the library's tolerance.
type Verifier struct {
	hooks []*standardwebhooks.Webhook
	now   func() time.Time
}

// NewVerifier parses whsec_ secrets. now is the clock; nil means time.Now.
// Errors name the secret's position, never its text.
func NewVerifier(secrets []string, now func() time.Time) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("no webhook secret")
	}
	if now == nil {
		now = time.Now
	}
	v := &Verifier{now: now}
	for i, s := range secrets {
		if err := ValidateSecret(s); err != nil {
			return nil, fmt.Errorf("webhook secret #%d: %w", i+1, err)
		}
		// It cannot fail: the library decodes the same standard base64
		// that ValidateSecret just decoded.
		wh, _ := standardwebhooks.NewWebhook(s)
		v.hooks = append(v.hooks, wh)
	}
	return v, nil
}

// Verify checks the three headers (Check) and the signature over body. It
// returns nil, or an error matching one of ErrUnsigned, ErrBadTimestamp,
// ErrStale, ErrFuture, ErrBadSignature. Every webhook-signature header line
// and every space-separated entry in each is considered (spec §6): a
// request passes when any entry verifies.
func (v *Verifier) Verify(body []byte, h http.Header) error {
	signed, err := v.headers(h)
	if err != nil {
		return err
	}
	// Try every secret even after a match, so the time taken does not say
	// which secret (old or new) signed the request.
	err = ErrBadSignature
	for _, wh := range v.hooks {
		if wh.VerifyIgnoringTimestamp(body, signed) == nil {
			err = nil
		}
	}
	return err
}

// Check judges the headers alone, as Verify does before it looks at the
// body: the error Verify would return whatever the body (a header missing,
// a timestamp unreadable or outside Tolerance — saying how far —, or no v1
// entry at all), or nil when some body could verify. The receiver calls it
// before it reads a body (spec §6).
func (v *Verifier) Check(h http.Header) error {
	_, err := v.headers(h)
	return err
}

// headers is Check, returning the headers for the library, with every
// signature entry on one line.
func (v *Verifier) headers(h http.Header) (http.Header, error) {
	id := h.Get(standardwebhooks.HeaderWebhookID)
	ts := h.Get(standardwebhooks.HeaderWebhookTimestamp)
	// The entries ("v1,<base64>", …) of every webhook-signature line, split
	// on white space. A proxy that joined several lines into one with ", "
	// leaves "v1,<base64>," entries, which the library still reads (it
	// takes the part after the first comma).
	var sigs []string
	for _, l := range h.Values(standardwebhooks.HeaderWebhookSignature) {
		sigs = append(sigs, strings.Fields(l)...)
	}
	if id == "" || ts == "" || len(sigs) == 0 {
		return nil, ErrUnsigned
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, ErrBadTimestamp
	}
	// The library's window: older than now-Tolerance or newer than
	// now+Tolerance fails.
	if off := v.now().Sub(time.Unix(sec, 0)); off > Tolerance {
		return nil, fmt.Errorf("%w: %v before this host's clock (at most %v)", ErrStale, off.Round(time.Second), Tolerance)
	} else if -off > Tolerance {
		return nil, fmt.Errorf("%w: %v after this host's clock (at most %v)", ErrFuture, (-off).Round(time.Second), Tolerance)
	}
	// The library reads "v1,<base64>" entries and skips the others.
	if !slices.ContainsFunc(sigs, func(e string) bool { return strings.HasPrefix(e, "v1,") }) {
		return nil, fmt.Errorf("%w: webhook-signature has no v1 entry", ErrBadSignature)
	}
	// The library reads only the first webhook-signature line (Get): hand
	// it every entry of every line as one line, which it splits on spaces.
	signed := h.Clone()
	signed.Set(standardwebhooks.HeaderWebhookSignature, strings.Join(sigs, " "))
	return signed, nil
}

// ValidateSecret checks that s is whsec_ followed by standard base64 of at
// least MinSecretBytes bytes. The error never contains s.
func ValidateSecret(s string) error {
	if !strings.HasPrefix(s, secretPrefix) {
		return errors.New("does not start with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(s[len(secretPrefix):])
	if err != nil {
		return errors.New("the part after whsec_ is not standard base64")
	}
	if len(key) < MinSecretBytes {
		return fmt.Errorf("decodes to %d bytes, fewer than the %d that Standard Webhooks asks for", len(key), MinSecretBytes)
	}
	return nil
}

// LoadSecrets gathers webhook secrets from env (the value of
// GEMRECON_WEBHOOK_SECRET: secrets separated by white space or commas) and
// from file (one secret per line; blank lines and lines starting with # are
// skipped), in that order, without repeats. Either may be empty. Each secret
// is validated; errors say where the bad secret came from (variable or file
// and line), never its text. No secrets at all is not an error here: the
// caller decides (serve refuses to start without --insecure-no-verify).
func LoadSecrets(env string, file string) ([]string, error) {
	var out []string
	add := func(s, where string) error {
		if err := ValidateSecret(s); err != nil {
			return fmt.Errorf("webhook secret in %s: %w", where, err)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
		return nil
	}
	for i, s := range strings.Fields(strings.ReplaceAll(env, ",", " ")) {
		if err := add(s, fmt.Sprintf("%s (item %d)", SecretEnv, i+1)); err != nil {
			return nil, err
		}
	}
	if file == "" {
		return out, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		// os errors carry the path and the cause, not the contents.
		return nil, fmt.Errorf("webhook secret file: %w", err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		s := strings.TrimSpace(line)
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if err := add(s, fmt.Sprintf("%s line %d", file, i+1)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
