package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGuarantees(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "g.md")
	os.WriteFile(doc, []byte("# G\n\n## The tests\n\n| test | what |\n|---|---|\n| `TestA`, `TestB` (p) | x |\n\n## After\n\n| `TestC` | not a guarantee |\n"), 0o600)
	ev := func(action, test, output string) string {
		return `{"Action":"` + action + `","Package":"p","Test":"` + test + `","Output":` + quote(output) + "}\n"
	}
	for _, tc := range []struct {
		name, in string
		ok       bool
		says     string
	}{
		{"all passed", ev("pass", "TestA", "") + ev("pass", "TestB", "") + ev("output", "", "ok  \tp\t1s\n"), true, "ran and passed (2 tests)"},
		{"one missing", ev("pass", "TestA", ""), false, "TestB did not pass"},
		{"a subtest skipped", ev("pass", "TestA", "") + ev("skip", "TestB/postgres", "") + ev("pass", "TestB", ""), false, "TestB was skipped, in whole or in part: TestB/postgres"},
		{"a failure shows its output", ev("output", "TestX", "boom\n") + ev("fail", "TestX", "") + ev("pass", "TestA", "") + ev("pass", "TestB", ""), false, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			ok, err := run(strings.NewReader(tc.in), &out, doc)
			if err != nil || ok != tc.ok || !strings.Contains(out.String(), tc.says) {
				t.Fatalf("run = %v, %v; want %v saying %q:\n%s", ok, err, tc.ok, tc.says, out.String())
			}
		})
	}
}

func quote(s string) string {
	return `"` + strings.NewReplacer("\\", `\\`, "\n", `\n`, "\t", `\t`, `"`, `\"`).Replace(s) + `"`
}
