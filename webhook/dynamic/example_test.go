package dynamic_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// A receiver verifies a dynamic delivery and maps the two error kinds to
// HTTP statuses (503 for ErrUnavailable, so that the sender retries; else
// 401); the scheme tells it that the key must be confirmed against the API
// before its effect runs.
func Example() {
	keys, err := fakejwks.New(fakejwks.Options{}) // the emulator's key server
	if err != nil {
		panic(err)
	}
	jwks := httptest.NewServer(keys)
	defer jwks.Close()

	v, err := dynamic.New(dynamic.Config{JWKSURL: jwks.URL})
	if err != nil {
		panic(err)
	}

	body := []byte(`{"type":"batch.succeeded","data":{"id":"batches/123"}}`)
	now := time.Now()
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", keys.SignV1a("msg_1", now, body))

	res, err := v.Verify(context.Background(), body, h)
	if err != nil {
		fmt.Println(err, errors.Is(err, dynamic.ErrUnavailable))
		return
	}
	fmt.Println("verified by", res.Scheme, "- confirm before running")

	// A stale delivery is refused without asking the key server.
	old := now.Add(-time.Hour)
	h.Set("webhook-timestamp", strconv.FormatInt(old.Unix(), 10))
	h.Set("webhook-signature", keys.SignV1a("msg_1", old, body))
	_, err = v.Verify(context.Background(), body, h)
	fmt.Println(errors.Is(err, dynamic.ErrUnverified), errors.Is(err, dynamic.ErrUnavailable))
	// Output:
	// verified by v1a - confirm before running
	// true false
}
