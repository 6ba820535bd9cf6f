package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeBlock returns the lines of the fenced block that follows the
// "<!-- readme-test: NAME" marker in the README.
func readmeBlock(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "<!-- readme-test: "+name)
	if i < 0 {
		t.Fatalf("README.md has no readme-test marker %q", name)
	}
	text = text[i:]
	start := strings.Index(text, "```sh\n")
	if start < 0 {
		t.Fatalf("no ```sh block after marker %q", name)
	}
	text = text[start+len("```sh\n"):]
	end := strings.Index(text, "```")
	var lines []string
	for _, l := range strings.Split(text[:end], "\n") {
		if cmd, _, _ := strings.Cut(l, "#"); strings.TrimSpace(cmd) != "" {
			lines = append(lines, strings.TrimSpace(cmd))
		}
	}
	return lines
}

// TestReadmeCommands runs the README's demo commands as a user would, with
// `go run ./cmd/gemrecon` standing for this very binary and the kept
// directory moved into a temporary one, so the README cannot silently rot.
func TestReadmeCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo twice")
	}
	bin := t.TempDir()
	wrapper := filepath.Join(bin, "gemrecon")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nGEMRECON_CLI_CHILD=1 exec "+shellQuote(os.Args[0])+` "$@"`+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
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
	if !strings.Contains(out, "each completion ran its effect once") {
		t.Fatalf("demo output lacks its conclusion:\n%s", out)
	}

	lines := readmeBlock(t, "demo-keep")
	if len(lines) != 2 {
		t.Fatalf("want 2 commands in the demo-keep block, got %q", lines)
	}
	run(lines[0])
	out = run(lines[1])
	for _, want := range []string{"gemini:batches/demo-quota", "done"} {
		if !strings.Contains(out, want) {
			t.Errorf("status on the kept database lacks %q:\n%s", want, out)
		}
	}
}
