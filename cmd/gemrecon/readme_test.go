package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/internal/testkit"
)

// readmeBlock returns the command lines (comments dropped) of the ```sh
// block that follows the "<!-- readme-test: NAME" marker in the README.
func readmeBlock(t *testing.T, name string) []string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(docBlock(t, "README.md", "readme-test: "+name, "sh"), "\n") {
		if cmd, _, _ := strings.Cut(l, "#"); strings.TrimSpace(cmd) != "" {
			lines = append(lines, strings.TrimSpace(cmd))
		}
	}
	return lines
}

// docBlock returns the text of the ```lang block that follows the
// "<!-- MARKER" comment in file (relative to the repository's root).
func docBlock(t *testing.T, file, marker, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", file))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "<!-- "+marker)
	if i < 0 {
		t.Fatalf("%s has no marker %q", file, marker)
	}
	text = text[i:]
	start := strings.Index(text, "```"+lang+"\n")
	if start < 0 {
		t.Fatalf("%s: no ```%s block after marker %q", file, lang, marker)
	}
	text = text[start+len("```"+lang+"\n"):]
	return text[:strings.Index(text, "```")]
}

// gemreconOnPath returns the path of the gemrecon that a shell finds: this
// test binary, which testkit.Main puts first in $PATH.
func gemreconOnPath(t *testing.T) string {
	t.Helper()
	exe, err := exec.LookPath("gemrecon")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestReadmeCommands runs the README's demo commands as a user would, with
// `go run ./cmd/gemrecon` standing for this very binary and the kept
// directory moved into a temporary one, so the README cannot silently rot.
func TestReadmeCommands(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("runs the demo twice")
	}
	wrapper := gemreconOnPath(t)
	keep := filepath.Join(t.TempDir(), "kept")
	run := func(line string) string {
		t.Helper()
		if !strings.HasPrefix(line, "go run ./cmd/gemrecon ") {
			t.Fatalf("README command %q does not start with `go run ./cmd/gemrecon`", line)
		}
		line = strings.ReplaceAll(line, "go run ./cmd/gemrecon", shellQuote(wrapper))
		line = strings.ReplaceAll(line, "/tmp/gemrecon-demo", keep)
		cmd := exec.Command("/bin/sh", "-c", line)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "GEMRECON_DB=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("README command %q failed: %v\n%s", line, err, out)
		}
		return string(out)
	}

	first := readmeBlock(t, "first-screen")
	if len(first) != 2 || !strings.HasSuffix(first[0], " demo") || first[1] != "go test ./..." {
		t.Fatalf("the README's first screen should give exactly the demo and the test command, got %q", first)
	}
	out := run(first[0])
	for _, want := range []string{
		"each completion ran its effect once",
		// A per-job webhook, verified dynamically and confirmed.
		"per-job webhook (v1a + JWT) delivered batches/demo-embeddings → 202",
		"effect ran for gemini:batches/demo-embeddings: SUCCEEDED, first seen by webhook, confirmed by the API, results in results/demo-embeddings.jsonl",
		// The lost webhook, found by the poll pass.
		"batches/demo-lost-hook was new to the pass",
		// What a webhook-first key's effect received.
		"The effect of batches/demo-nightly (first seen by webhook) received",
		"operation     batches/demo-nightly: metadata.state BATCH_STATE_SUCCEEDED",
		"confirmed=true, batch_state=SUCCEEDED",
		"demo-nightly.jsonl (3 lines, written before the effect ran)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}

	lines := readmeBlock(t, "demo-keep")
	if len(lines) != 2 {
		t.Fatalf("want 2 commands in the demo-keep block, got %q", lines)
	}
	run(lines[0])
	// The kept directory: one effect line per completion, each confirmed,
	// and the succeeded batches' results.
	effects := readLines(t, filepath.Join(keep, "effects.log"))
	if len(effects) != 5 {
		t.Errorf("kept effects.log has %d lines, want 5:\n%s", len(effects), strings.Join(effects, "\n"))
	}
	for _, l := range effects {
		if !strings.Contains(l, "confirmed=true") {
			t.Errorf("an effect ran unconfirmed: %q", l)
		}
	}
	for _, id := range []string{"demo-nightly", "demo-embeddings", "demo-lost-hook"} {
		if _, err := os.Stat(filepath.Join(keep, "results", id+".jsonl")); err != nil {
			t.Errorf("results of %s: %v", id, err)
		}
	}
	out = run(lines[1])
	for _, want := range []string{"gemini:batches/demo-quota", "done"} {
		if !strings.Contains(out, want) {
			t.Errorf("status on the kept database lacks %q:\n%s", want, out)
		}
	}
}

// TestReadmeTryLocally runs the README's local sandbox walkthrough ("Try it
// locally with the emulator") as a user in two terminals would: the
// emulator block in the background, then the client block as one shell
// script, with `gemrecon` on PATH standing for this very binary. What the
// test changes, and only that: the emulator gets --listen 127.0.0.1:0 and
// --seed 7 (a free port; the same story every run) and --finish-within 3s
// instead of 2m; serve's 127.0.0.1:8080 becomes a free port; the three
// export lines become the ones the emulator printed; and a `wait` after
// the script's `kill $!` lets serve finish its drain before the check.
// Every completion must run its effect once, per-job deliveries must have
// reached serve --dynamic and been accepted.
func TestReadmeTryLocally(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("runs the emulator, serve and poll as processes")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's walkthrough uses curl, which is not installed")
	}
	gemreconOnPath(t)
	work := t.TempDir()
	serveAddr := freeAddr(t)
	env := append(os.Environ(), "GEMRECON_DB=", "GOOGLE_API_KEY=", "GEMINI_API_KEY=", "GEMRECON_WEBHOOK_SECRET=", "GEMRECON_JWKS_URL=", "GOOGLE_GEMINI_BASE_URL=")
	local := func(line string) string { return strings.ReplaceAll(line, "127.0.0.1:8080", serveAddr) }

	emuBlock := readmeBlock(t, "try-locally-emulator")
	if len(emuBlock) != 1 || !strings.HasPrefix(emuBlock[0], "gemrecon emulator ") || !strings.Contains(emuBlock[0], "--finish-within 2m") {
		t.Fatalf("the emulator block should be one `gemrecon emulator … --finish-within 2m` line, got %q", emuBlock)
	}
	line := local(strings.Replace(emuBlock[0], "--finish-within 2m", "--finish-within 3s", 1)) + " --listen 127.0.0.1:0 --seed 7"
	emu := exec.Command("/bin/sh", "-c", "exec "+line)
	emu.Dir, emu.Env = work, env
	var emuOut, emuErr testkit.Buffer
	emu.Stdout, emu.Stderr = &emuOut, &emuErr
	if err := emu.Start(); err != nil {
		t.Fatal(err)
	}
	emuDone := make(chan error, 1)
	go func() { emuDone <- emu.Wait() }()
	t.Cleanup(func() {
		_ = emu.Process.Signal(syscall.SIGTERM)
		select {
		case <-emuDone:
		case <-time.After(30 * time.Second):
			_ = emu.Process.Kill()
		}
	})
	exports := map[string]string{}
	vars := map[string]string{}
	waitFor(t, 60*time.Second, func() bool {
		for _, l := range strings.Split(emuOut.String(), "\n") {
			if kv, ok := strings.CutPrefix(l, "export "); ok {
				k, v, _ := strings.Cut(kv, "=")
				exports[k], vars[k] = l, v
			}
		}
		return len(exports) == 3
	})

	var script []string
	for _, l := range readmeBlock(t, "try-locally-client") {
		if kv, ok := strings.CutPrefix(l, "export "); ok {
			name, _, _ := strings.Cut(kv, "=")
			printed, ok := exports[name]
			if !ok {
				t.Fatalf("the README exports %s, which the emulator does not print (it prints %v)", name, exports)
			}
			delete(exports, name)
			script = append(script, printed)
			continue
		}
		script = append(script, local(l))
	}
	if len(exports) != 0 {
		t.Fatalf("the README's client block lacks the emulator's exports %v", exports)
	}
	script = append([]string{"set -e"}, append(script, "wait")...)
	// Twice in the same folder: the walk-through starts afresh (its
	// cleanup line), so a second run finds no secret file to refuse to
	// overwrite and no database of the first. The emulator's batches have
	// all finished by then: the second run's serve gets no delivery, and
	// its poll finds every completion.
	for run := 1; run <= 2; run++ {
		sh := exec.Command("/bin/sh", "-c", strings.Join(script, "\n"))
		sh.Dir, sh.Env = work, env
		sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // serve runs in the background: kill the group on a timeout
		var out testkit.Buffer
		sh.Stdout, sh.Stderr = &out, &out
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		shDone := make(chan error, 1)
		go func() { shDone <- sh.Wait() }()
		select {
		case err := <-shDone:
			if err != nil {
				t.Fatalf("run %d of the walkthrough failed: %v\n%s\nemulator:\n%s", run, err, &out, &emuErr)
			}
		case <-time.After(120 * time.Second):
			_ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
			<-shDone
			t.Fatalf("run %d of the walkthrough did not end within 120s\n%s\nemulator:\n%s", run, &out, &emuErr)
		}
		if !strings.Contains(out.String(), "first source:") {
			t.Errorf("run %d: stats printed nothing recognisable:\n%s", run, &out)
		}
		c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: vars["GEMINI_API_KEY"], Backend: genai.BackendGeminiAPI,
			HTTPOptions: genai.HTTPOptions{BaseURL: vars["GOOGLE_GEMINI_BASE_URL"]}})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for name := range genaitest.ListAll(t, c, 5) {
			keys = append(keys, "gemini:"+name)
		}
		if len(keys) != 8 {
			t.Fatalf("the emulator lists %d batches, want the README's 8", len(keys))
		}
		for k, n := range effectsPerKey(t, filepath.Join(work, "try-effects.log"), keys) {
			if n != 1 {
				t.Errorf("run %d: %s: its effect ran %d times, want once", run, k, n)
			}
		}
	}
	dynamic := 0
	for _, l := range strings.Split(emuErr.String(), "\n") {
		if strings.Contains(l, "msg=delivery") && strings.Contains(l, "webhook=dynamic") && strings.Contains(l, "status=202") {
			dynamic++
		}
	}
	if dynamic == 0 {
		t.Errorf("no per-job delivery was accepted by serve --dynamic:\n%s", grepLines(emuErr.String(), "msg=delivery"))
	}
}
