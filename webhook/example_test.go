package webhook_test

import (
	"fmt"
	"time"

	"github.com/gemrecon/gemrecon/webhook"
)

// Sign produces the headers a Standard Webhooks sender attaches; this is the
// specification's reference vector.
func ExampleSign() {
	h, err := webhook.Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
		time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(h.Get("webhook-timestamp"))
	fmt.Println(h.Get("webhook-signature"))
	// Output:
	// 1614265330
	// v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

// LoadSecrets reads GEMRECON_WEBHOOK_SECRET's value and a secret file; an
// error names where the bad secret was, never the secret.
func ExampleLoadSecrets() {
	_, err := webhook.LoadSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw,whsec_tooShort", "")
	fmt.Println(err)
	// Output:
	// webhook secret in GEMRECON_WEBHOOK_SECRET (item 2): decodes to 6 bytes, fewer than the 24 that Standard Webhooks asks for
}
