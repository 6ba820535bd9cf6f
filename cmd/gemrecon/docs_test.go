package main

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"
)

// TestDocsUpToDate fails when docs/cli/ differs from what the cobra tree
// generates. Regenerate with:
//
//	GEMRECON_UPDATE_DOCS=1 go test ./cmd/gemrecon -run TestDocsUpToDate
func TestDocsUpToDate(t *testing.T) {
	// Defaults read from the environment would leak into the docs.
	for _, v := range []string{"GEMRECON_DB", "GEMRECON_LOG_FORMAT", "GEMRECON_LOG_LEVEL", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"} {
		t.Setenv(v, "")
	}
	gen := t.TempDir()
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	root.DisableAutoGenTag = true
	root.InitDefaultCompletionCmd()
	if err := doc.GenMarkdownTree(root, gen); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join("..", "..", "docs", "cli")
	if os.Getenv("GEMRECON_UPDATE_DOCS") == "1" {
		if err := os.RemoveAll(want); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(want, os.DirFS(gen)); err != nil {
			t.Fatal(err)
		}
		return
	}
	genFiles, haveFiles := listDir(t, gen), listDir(t, want)
	if len(genFiles) != len(haveFiles) {
		t.Errorf("docs/cli has %v, the command tree generates %v", haveFiles, genFiles)
	}
	for _, name := range genFiles {
		g, _ := os.ReadFile(filepath.Join(gen, name))
		h, err := os.ReadFile(filepath.Join(want, name))
		if err != nil || !bytes.Equal(g, h) {
			t.Errorf("docs/cli/%s is out of date", name)
		}
	}
	if t.Failed() {
		t.Log("regenerate: GEMRECON_UPDATE_DOCS=1 go test ./cmd/gemrecon -run TestDocsUpToDate")
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// TestManPages generates a man page per command from the command tree
// (cobra/doc), as scripts/release.sh ships them: into GEMRECON_MAN_DIR when
// it is set, else into a temporary directory, checking that every command
// has its page.
func TestManPages(t *testing.T) {
	for _, v := range []string{"GEMRECON_DB", "GEMRECON_LOG_FORMAT", "GEMRECON_LOG_LEVEL", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"} {
		t.Setenv(v, "")
	}
	dir := os.Getenv("GEMRECON_MAN_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	root.DisableAutoGenTag = true
	hdr := &doc.GenManHeader{Title: "GEMRECON", Section: "1", Source: "gemrecon", Manual: "gemrecon manual"}
	if err := doc.GenManTree(root, hdr, dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(root.Commands(), root) {
		if c.Hidden || c.Name() == "help" {
			continue
		}
		page := filepath.Join(dir, strings.ReplaceAll(c.CommandPath(), " ", "-")+".1")
		if b, err := os.ReadFile(page); err != nil || !bytes.Contains(b, []byte(c.Short)) {
			t.Errorf("man page %s: %v, or it lacks the command's summary", page, err)
		}
	}
}
