package webhook_test

import (
	"fmt"

	"github.com/gemrecon/gemrecon/webhook"
)

// LoadSecrets reads GEMRECON_WEBHOOK_SECRET's value and a secret file; an
// error names where the bad secret was, never the secret.
func ExampleLoadSecrets() {
	_, err := webhook.LoadSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw,whsec_tooShort", "")
	fmt.Println(err)
	// Output:
	// webhook secret in GEMRECON_WEBHOOK_SECRET (item 2): decodes to 6 bytes, fewer than the 24 that Standard Webhooks asks for
}
