package main

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// The whole sandbox as separate real processes (issue 15, "Done when" 2):
// `gemrecon emulator`; a static webhook registered with `webhooks create`;
// `serve --dynamic` with its HMAC secret too; batches created through the
// SDK, half of them with a webhookConfig pointing at serve (dynamic, v1a
// and JWT), the others delivered through the static webhook, some
// deliveries dropped and some duplicated; generated batches that finished
// before anything listened (FAILED, EXPIRED, CANCELLED among them: only a
// poll finds those); and `poll` run again and again as cron would, each a
// new process on the same database, all of them running effects. Every
// completion's effect runs exactly once, confirmed. A ping through the SDK
// lands at serve, which answers 200 ignored. Every wait is bounded (the
// emulator's /emulator/status says when its batches and deliveries have
// ended). The batches are created after the webhook exists, one after
// another, so the seeded drops and duplicates (drawn per message in queue
// order) are the same on every run.
func TestEndToEndEmulatorServePoll(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("starts the emulator, serve and several polls as processes")
	}
	const generated, created = 4, 12
	const batches = generated + created
	dir := t.TempDir()
	db, log, secrets := initDB(t, filepath.Join(dir, "e2e.db")), filepath.Join(dir, "effects.log"), filepath.Join(dir, "whsec")
	serveAddr := freeAddr(t)
	hook := "http://" + serveAddr + "/webhook"

	emu := startEmulator(t, "--batches", itoa(generated), "--finish-within", "0", "--created-finish-after", "1500ms",
		"--seed", "15", "--drop", "0.3", "--duplicate", "0.5")
	env := []string{"GEMINI_API_KEY=" + emu.key, "GOOGLE_API_KEY=", "GEMRECON_WEBHOOK_SECRET="}
	r := gemreconWith(t, env, "webhooks", "--base-url", emu.url, "create", "--url", hook,
		"--events", "batch.succeeded,batch.failed,batch.expired,batch.cancelled", "--secret-file", secrets)
	wantCode(t, r, exitOK)
	id := match(t, idLine, r.stdout)

	effect := `--exec=echo "$GEMRECON_KEY $GEMRECON_SOURCE $GEMRECON_CONFIRMED" >> ` + shellQuote(log)
	serve := child(t, "--db", db, "serve", "--listen", serveAddr, "--secret-file", secrets, "--dynamic",
		"--jwks-url", emu.jwks, "--base-url", emu.url, "--retry-base", "200ms", "--retry-max", "1s", effect)
	serve.Env = append(serve.Env, env...)
	var serveErr testkit.Buffer
	serve.Stderr = &serveErr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- serve.Wait() }()
	t.Cleanup(func() {
		if serve.ProcessState == nil {
			_ = serve.Process.Kill()
			<-serveDone
		}
	})
	waitHealthy(t, "http://"+serveAddr+"/healthz", &serveErr)

	c := emu.client(t)
	for i := range created {
		cfg := &genai.CreateBatchJobConfig{}
		if i%2 == 0 {
			cfg.WebhookConfig = &genai.WebhookConfig{Uris: []string{hook}, UserMetadata: map[string]any{"n": i}}
		}
		if _, err := c.Batches.Create(context.Background(), "gemini-2.5-flash", &genai.BatchJobSource{
			InlinedRequests: []*genai.InlinedRequest{{Contents: genai.Text("Hello " + itoa(i))}},
		}, cfg); err != nil {
			t.Fatal(err)
		}
	}

	// Cron: a poll process now and then until the emulator is idle with
	// every batch finished, then one last pass.
	poll := func() {
		t.Helper()
		cmd := child(t, "--db", db, "poll", "--base-url", emu.url, "--qps", "0", "--retry-base", "200ms", "--retry-max", "1s", effect)
		cmd.Env = append(cmd.Env, env...)
		code, stderr, _ := runBounded(t, cmd, 60*time.Second)
		if code != exitOK {
			t.Errorf("poll exited %d\n%s", code, stderr)
		}
	}
	polls := 0
	deadline := time.Now().Add(60 * time.Second)
	for {
		poll()
		polls++
		st := emu.status(t)
		if st.Idle && st.Finished == created { // the generated ones were added finished
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the emulator is not idle after 60s: %+v", st)
		}
		time.Sleep(300 * time.Millisecond)
	}
	poll()
	waitKeysDone(t, db, batches)

	// Every completion ran its effect exactly once.
	var keys []string
	for name, job := range genaitest.ListAll(t, c, 5) {
		if !genaitest.Terminal(job.State) {
			t.Errorf("%s is %s after the emulator went idle", name, job.State)
		}
		keys = append(keys, "gemini:"+name)
	}
	if len(keys) != batches {
		t.Fatalf("the emulator lists %d batches, want %d", len(keys), batches)
	}
	for k, n := range effectsPerKey(t, log, keys) {
		if n != 1 {
			t.Errorf("%s: its effect ran %d times, want once", k, n)
		}
	}
	for _, l := range readLines(t, log) {
		if !strings.HasSuffix(l, " true") {
			t.Errorf("an effect ran unconfirmed: %q", l)
		}
	}

	// The story was the one intended: drops and duplicates happened, both
	// kinds of webhook reached serve and were accepted, and both paths saw
	// completions first.
	st := emu.status(t)
	if st.Deliveries.Dropped == 0 || st.Deliveries.Duplicates == 0 {
		t.Errorf("want some deliveries dropped and some duplicated: %+v", st.Deliveries)
	}
	accepted := map[string]int{}
	for _, ev := range emu.events("delivery") {
		if ev["event"] != "webhook.ping" && ev["status"] == float64(http.StatusAccepted) {
			accepted[ev["webhook"].(string)]++
		}
	}
	if accepted["static"] == 0 || accepted["dynamic"] == 0 {
		t.Errorf("serve accepted static %d and dynamic %d deliveries, want some of each\n%s", accepted["static"], accepted["dynamic"], &serveErr)
	}
	stats := statsJSON(t, db)
	if stats.FirstSource[sink.SourceWebhook] == 0 || stats.FirstSource[sink.SourcePoll] == 0 {
		t.Errorf("first sources %v: want keys first seen by each path", stats.FirstSource)
	}
	if bytes.Contains([]byte(serveErr.String()), []byte("level=ERROR")) {
		t.Errorf("serve logged errors:\n%s", grepLines(serveErr.String(), "level=ERROR"))
	}
	t.Logf("%d polls; deliveries %+v; accepted by serve %v; first sources %v", polls, st.Deliveries, accepted, stats.FirstSource)

	// The ping (sent last, so that the seeded drops and duplicates of the
	// batches' deliveries do not depend on when it was queued): verified
	// with the secret create wrote, answered 200. The emulator's --drop
	// loses pings too: ping until one arrives.
	pings := func() (sent int, statuses []any) {
		for _, ev := range emu.events("delivery") {
			if ev["event"] == "webhook.ping" {
				sent++
				if ev["outcome"] != "dropped" {
					statuses = append(statuses, ev["status"])
				}
			}
		}
		return sent, statuses
	}
	for i := 1; ; i++ {
		wantCode(t, gemreconWith(t, env, "webhooks", "--base-url", emu.url, "ping", id), exitOK)
		waitFor(t, 30*time.Second, func() bool { n, _ := pings(); return n >= i })
		if _, statuses := pings(); len(statuses) > 0 {
			break
		}
		if i == 10 {
			t.Fatalf("no ping reached serve in 10 tries")
		}
	}
	for _, status := range func() []any { _, s := pings(); return s }() {
		if status != float64(http.StatusOK) { // every attempt, duplicates included
			t.Errorf("serve answered a ping %v, want 200 (ignored)", status)
		}
	}

	_ = serve.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-serveDone:
		if err != nil {
			t.Errorf("serve exited with %v after SIGTERM\n%s", err, &serveErr)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("serve did not stop within 30s of SIGTERM")
	}
}
