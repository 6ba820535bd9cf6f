package docref

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestReferencesResolve is the repository's own check: every section
// reference in a Go file names a heading under docs/, and every docs/… path
// a comment cites exists. A failure names file:line and the missing target.
func TestReferencesResolve(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Problems {
		t.Error(p)
	}
	// The code cites the contract dozens of times; finding nothing would
	// mean the scan looked in the wrong place, not that all is well.
	if r.Refs < 20 || r.Headings < 8 {
		t.Errorf("found %d references and %d numbered headings under %s: the scan is broken", r.Refs, r.Headings, root)
	}
}

// The section sign, written as an escape so that this file's fixtures are
// not themselves references to this repository's docs.
const sect = "\u00a7"

// writeTree writes files (slash-separated paths) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, text := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// The checker itself, on a small module with one problem of every kind and
// references of every kind that must pass.
func TestCheckReportsEachUnresolvedReference(t *testing.T) {
	root := writeTree(t, map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26\n",
		"docs/design.md": "# Design\n\n## " + sect + "1 One\n\n### " + sect + "1.2 Sub\n\n" +
			"```\n## " + sect + "7 inside a code block: not a heading\n```\n\n## " + sect + "2 Two\n",
		"docs/other.md": "## " + sect + "2 Two again\n",
		"a.go": "package m\n\n" +
			"// spec " + sect + "1 and " + sect + "1.2, and " + sect + "2 resolve.\n" + // line 3
			"// spec " + sect + "3 does not; nor does " + sect + "1.3.\n" + // line 4
			"// RFC 9110 " + sect + "10.2.3 is another document's section.\n" + // line 5
			"// See docs/design.md and docs/missing.md.\n" + // line 6
			"var s = \"docs/not-a-comment.md\"\n" + // line 7: strings are not checked for paths
			"\n/* a block comment\n   that cites " + sect + "7 and docs/gone/ */\n", // lines 9-10
		"sub/b.go":      "package sub\n\n// docs/ alone names nothing; docs/design.md.\n",
		"testdata/c.go": "package c\n// " + sect + "9 in testdata is not scanned\n",
		".hidden/d.go":  "package d\n// " + sect + "9 in a dot directory is not scanned\n",
	})
	r, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Problems {
		got = append(got, p.File+":"+itoa(p.Line)+" "+p.Target)
	}
	want := []string{
		"a.go:4 " + sect + "3",
		"a.go:4 " + sect + "1.3",
		"a.go:6 docs/missing.md",
		"a.go:10 " + sect + "7",
		"a.go:10 docs/gone",
		"docs/other.md:1 " + sect + "2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n got %q\nwant %q", got, want)
	}
	// Six section references (three on line 3, two on line 4, one on line
	// 10) and four paths (two on line 6, one on line 10, one in b.go).
	if r.Refs != 10 || r.Headings != 3 {
		t.Errorf("Refs = %d, Headings = %d; want 10 and 3", r.Refs, r.Headings)
	}
	for _, p := range r.Problems {
		if s := p.String(); !strings.HasPrefix(s, p.File+":"+itoa(p.Line)+": "+p.Target+": ") {
			t.Errorf("Problem.String() = %q: want file:line: target: why", s)
		}
	}
}

// Without docs/ at all, every section reference is a problem (the state of
// the repository before docs/ existed).
func TestCheckWithoutDocs(t *testing.T) {
	root := writeTree(t, map[string]string{
		"go.mod": "module example.com/m\n",
		"a.go":   "package m\n\n// spec " + sect + "3 (see docs/design.md)\n",
	})
	r, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 2 || r.Problems[0].Target != sect+"3" || r.Problems[1].Target != "docs/design.md" {
		t.Errorf("problems = %v, want the section and the path of a.go:3", r.Problems)
	}
}

func TestModuleRoot(t *testing.T) {
	root := writeTree(t, map[string]string{"go.mod": "module example.com/m\n", "x/y/z.go": "package y\n"})
	got, err := ModuleRoot(filepath.Join(root, "x", "y"))
	if err != nil || got != root {
		t.Errorf("ModuleRoot(x/y) = %q, %v; want %q", got, err, root)
	}
	if _, err := ModuleRoot(string(filepath.Separator)); err == nil {
		t.Errorf("ModuleRoot(/) found a go.mod at the file system root")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
