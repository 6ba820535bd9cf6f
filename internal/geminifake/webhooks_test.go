package geminifake

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"
	"google.golang.org/genai/interactions/models/apierrors"
	"google.golang.org/genai/interactions/models/operations"
	"google.golang.org/genai/interactions/models/webhooks"

	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/webhook"

	"github.com/gemrecon/gemrecon/internal/testkit"
)

const whKey = "wh-test-key"

func statusOf(t *testing.T, err error) int {
	t.Helper()
	var ae *apierrors.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("want an *apierrors.APIError, got %T %v", err, err)
	}
	return ae.StatusCode
}

func createHook(t *testing.T, c *genai.Client, uri string, events ...webhooks.WebhookSubscribedEvent) *webhooks.Webhook {
	t.Helper()
	res, err := c.Webhooks.Create(context.Background(), operations.CreateWebhookRequest{
		Body: webhooks.WebhookInput{Name: genai.Ptr("test"), SubscribedEvents: events, URI: uri},
	})
	if err != nil {
		t.Fatal(err)
	}
	return res.Webhook
}

// Every WebhookService method through the SDK v1.79.1: paths, methods, JSON
// names and response shapes are the SDK's.
func TestWebhookServiceThroughSDK(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	ctx := context.Background()
	c := genaitest.Client(t, base+"/", whKey)

	w := createHook(t, c, "https://hooks.example.com/webhook",
		webhooks.WebhookSubscribedEventBatchSucceeded, webhooks.WebhookSubscribedEventBatchFailed)
	secret := w.GetNewSigningSecret()
	if secret == nil || webhook.ValidateSecret(*secret) != nil {
		t.Fatalf("create: new_signing_secret %v is not a whsec_ secret serve accepts", secret)
	}
	id := *w.GetID()
	if w.GetState() == nil || *w.GetState() != webhooks.WebhookStateEnabled || w.GetURI() != "https://hooks.example.com/webhook" ||
		len(w.GetSubscribedEvents()) != 2 || w.GetCreateTime() == nil || len(w.GetSigningSecrets()) != 1 {
		t.Fatalf("create returned %+v", w)
	}
	if tr := *w.GetSigningSecrets()[0].GetTruncatedSecret(); strings.Contains(*secret, tr) || len(tr) >= len(*secret) {
		t.Errorf("truncated_secret %q reveals the secret", tr)
	}

	got, err := c.Webhooks.Get(ctx, operations.GetWebhookRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if got.Webhook.GetNewSigningSecret() != nil {
		t.Error("get shows the signing secret again; only create may")
	}

	// Paging: 5 webhooks, pages of 2, each listed once.
	for range 4 {
		createHook(t, c, "https://hooks.example.com/other", webhooks.WebhookSubscribedEventBatchExpired)
	}
	var ids []string
	var token *string
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("list does not end")
		}
		res, err := c.Webhooks.List(ctx, operations.ListWebhooksRequest{PageSize: genai.Ptr(2), PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range res.WebhookListResponse.GetWebhooks() {
			ids = append(ids, *x.GetID())
		}
		token = res.WebhookListResponse.GetNextPageToken()
		if token == nil {
			break
		}
	}
	if len(ids) != 5 || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 5 || ids[0] != id {
		t.Fatalf("listed %v, want 5 distinct ids starting with %s", ids, id)
	}

	up, err := c.Webhooks.Update(ctx, operations.UpdateWebhookRequest{ID: id, UpdateMask: genai.Ptr("state"),
		Body: webhooks.WebhookUpdate{State: webhooks.WebhookUpdateStateDisabled.ToPointer(), Name: genai.Ptr("ignored: not in the mask")}})
	if err != nil {
		t.Fatal(err)
	}
	if *up.Webhook.GetState() != webhooks.WebhookStateDisabled || *up.Webhook.GetName() != "test" {
		t.Fatalf("update with mask state: %+v", up.Webhook)
	}

	rot, err := c.Webhooks.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	newSecret := rot.WebhookRotateSigningSecretResponse.GetSecret()
	if newSecret == nil || *newSecret == *secret || webhook.ValidateSecret(*newSecret) != nil {
		t.Fatalf("rotate returned %v", newSecret)
	}
	got, _ = c.Webhooks.Get(ctx, operations.GetWebhookRequest{ID: id})
	ss := got.Webhook.GetSigningSecrets()
	if len(ss) != 2 || ss[0].GetExpireTime() != nil || ss[1].GetExpireTime() == nil ||
		time.Until(*ss[1].GetExpireTime()) < 23*time.Hour || time.Until(*ss[1].GetExpireTime()) > 25*time.Hour {
		t.Fatalf("after a default rotation want the new secret without end and the old one expiring in 24 h, got %+v", ss)
	}
	held, _ := s.Webhooks().Get(id)
	if held.Secrets[0].Secret != *newSecret || held.Secrets[1].Secret != *secret {
		t.Fatalf("secrets held: %+v", held.Secrets)
	}
	if _, err := c.Webhooks.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: id,
		Body: webhooks.RotateSigningSecretRequest{RevocationBehavior: webhooks.RevocationBehaviorRevokePreviousSecretsImmediately.ToPointer()}}); err != nil {
		t.Fatal(err)
	}
	got, _ = c.Webhooks.Get(ctx, operations.GetWebhookRequest{ID: id})
	if n := len(got.Webhook.GetSigningSecrets()); n != 1 {
		t.Fatalf("after an immediate rotation want 1 secret, got %d", n)
	}

	if _, err := c.Webhooks.Ping(ctx, operations.PingWebhookRequest{ID: id, Body: &webhooks.PingWebhookRequest{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Webhooks.Delete(ctx, operations.DeleteWebhookRequest{ID: id}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Webhooks.Get(ctx, operations.GetWebhookRequest{ID: id})
	if code := statusOf(t, err); code != http.StatusNotFound {
		t.Fatalf("get after delete: %d, want 404", code)
	}
	for _, call := range []func() error{
		func() error { _, err := c.Webhooks.Delete(ctx, operations.DeleteWebhookRequest{ID: id}); return err },
		func() error {
			_, err := c.Webhooks.Ping(ctx, operations.PingWebhookRequest{ID: id})
			return err
		},
		func() error {
			_, err := c.Webhooks.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: id})
			return err
		},
	} {
		if code := statusOf(t, call()); code != http.StatusNotFound {
			t.Errorf("unknown id: %d, want 404", code)
		}
	}

	// API key checks as on the batch endpoints.
	_, err = genaitest.Client(t, base+"/", "wrong").Webhooks.List(ctx, operations.ListWebhooksRequest{})
	if code := statusOf(t, err); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d, want 401", code)
	}
	resp, err := http.Get(base + "/v1beta/webhooks")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("no key: %d, want 403", resp.StatusCode)
	}

	// The SDK sent what this test expects, on the SDK's paths.
	var paths []string
	for _, r := range s.Requests() {
		paths = append(paths, r.Method+" "+r.Path)
	}
	for _, want := range []string{"POST /v1beta/webhooks", "GET /v1beta/webhooks", "GET /v1beta/webhooks/" + id,
		"PATCH /v1beta/webhooks/" + id, "POST /v1beta/webhooks/" + id + ":rotateSigningSecret",
		"POST /v1beta/webhooks/" + id + ":ping", "DELETE /v1beta/webhooks/" + id} {
		if !slices.Contains(paths, want) {
			t.Errorf("no request %q among %q", want, paths)
		}
	}
}

func rawCall(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	code, _, b := testkit.Call(t, method, url, body, http.Header{"X-Goog-Api-Key": {whKey}})
	return code, string(b)
}

// Bad requests are answered 400 with a message, and nothing is created.
func TestWebhookServiceRefusesBadInput(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	u := base + "/v1beta/webhooks"
	for _, tc := range []struct{ name, body, want string }{
		{"relative uri", `{"uri":"/webhook","subscribed_events":["batch.succeeded"]}`, "uri"},
		{"ftp uri", `{"uri":"ftp://x/y","subscribed_events":["batch.succeeded"]}`, "uri"},
		{"no events", `{"uri":"https://x/y"}`, "subscribed_events"},
		{"unknown event", `{"uri":"https://x/y","subscribed_events":["batch.done"]}`, "batch.done"},
		{"unknown field", `{"uri":"https://x/y","subscribedEvent":["batch.succeeded"]}`, "subscribedEvent"},
		{"not an object", `["x"]`, "object"},
		{"events not a list", `{"uri":"https://x/y","subscribed_events":"batch.succeeded"}`, "subscribed_events"},
	} {
		code, body := rawCall(t, http.MethodPost, u, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(body, tc.want) || !strings.Contains(body, "INVALID_ARGUMENT") {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.name, code, body, tc.want)
		}
	}
	if n := len(s.Webhooks().All()); n != 0 {
		t.Fatalf("bad requests created %d webhooks", n)
	}
	// proto JSON takes lowerCamelCase names too.
	code, body := rawCall(t, http.MethodPost, u, `{"uri":"https://x/y","subscribedEvents":["batch.cancelled"]}`)
	if code != http.StatusOK || !strings.Contains(body, `"subscribed_events":["batch.cancelled"]`) {
		t.Fatalf("camelCase create: %d %s", code, body)
	}
	id := s.Webhooks().All()[0].ID
	if code, body := rawCall(t, http.MethodPost, u+"/"+id+":rotateSigningSecret", `{"revocation_behavior":"never"}`); code != http.StatusBadRequest {
		t.Errorf("bad revocation_behavior: %d %s", code, body)
	}
	if code, body := rawCall(t, http.MethodPatch, u+"/"+id, `{"state":"disabled_due_to_failed_deliveries"}`); code != http.StatusBadRequest {
		t.Errorf("state set to an output-only value: %d %s", code, body)
	}
	if code, _ := rawCall(t, http.MethodGet, u+"?page_token=garbage", ""); code != http.StatusBadRequest {
		t.Errorf("bad page token: %d", code)
	}
	if code, _ := rawCall(t, http.MethodPost, u+"/"+id+":explode", ""); code != http.StatusNotFound {
		t.Errorf("unknown verb: %d", code)
	}
	if code, _ := rawCall(t, http.MethodPut, u+"/"+id, "{}"); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", code)
	}
	// An empty list is {} (as Google APIs answer), which the SDK reads.
	s.Webhooks().Delete(id)
	res, err := genaitest.Client(t, base, whKey).Webhooks.List(context.Background(), operations.ListWebhooksRequest{})
	if err != nil || len(res.WebhookListResponse.GetWebhooks()) != 0 {
		t.Fatalf("empty list: %v %v", res, err)
	}
	// Faults injected for the batch endpoints apply here too.
	s.InjectFault(Fault{Status: http.StatusServiceUnavailable})
	if code, _ := rawCall(t, http.MethodPost, u, `{"uri":"https://x/y","subscribed_events":["batch.failed"]}`); code != http.StatusServiceUnavailable {
		t.Errorf("injected 503: got %d", code)
	}
}
