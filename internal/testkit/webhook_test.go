package testkit

import (
	"testing"
	"time"
)

// SignWebhook produces the Standard Webhooks reference vector. Source: the
// specification's repository, github.com/standard-webhooks/standard-webhooks,
// libraries/python/tests/test_webhooks.py, test_sign_function.
func TestSignWebhookReferenceVector(t *testing.T) {
	h, err := SignWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
		time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"webhook-id":        "msg_p5jXN8AQM9LWM0D4loKWxJek",
		"webhook-timestamp": "1614265330",
		"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if _, err := SignWebhook("not-a-secret", "m", time.Now(), nil); err == nil {
		t.Error("SignWebhook with a bad secret: no error")
	}
}
