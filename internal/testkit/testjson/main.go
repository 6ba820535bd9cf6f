// Command testjson reads `go test -json` on stdin and prints what a reader
// of CI's log needs: every package's result line, and the whole output of
// each test that failed. With -guarantees FILE it then checks the table of
// that file's "## The tests" section (docs/guarantees.md): every test it
// names must have passed, and neither it nor any of its subtests may have
// been skipped, so that no guarantee goes unproven because a server or a
// variable was missing. It exits 1 when a test failed or a check did not
// hold. .ci/run uses it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

type event struct {
	Action, Package, Test, Output string
}

func main() {
	guarantees := flag.String("guarantees", "", "check that the tests named in this file's \"## The tests\" table passed, none skipped")
	flag.Parse()
	ok, err := run(os.Stdin, os.Stdout, *guarantees)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testjson:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer, guarantees string) (bool, error) {
	outputs := map[string][]string{} // package + test → its output so far
	passed, skipped := map[string]bool{}, map[string][]string{}
	ok := true
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(out, sc.Text()) // not an event: the build's own output
			continue
		}
		id := e.Package + " " + e.Test
		top, _, _ := strings.Cut(e.Test, "/")
		switch {
		case e.Action == "build-output", e.Action == "output" && e.Test == "":
			fmt.Fprint(out, e.Output)
		case e.Action == "output":
			outputs[id] = append(outputs[id], e.Output)
		case e.Action == "fail" && e.Test != "":
			ok = false
			fmt.Fprint(out, strings.Join(outputs[id], ""))
			delete(outputs, id)
		case e.Action == "fail":
			ok = false
		case e.Action == "pass" && e.Test != "" && !strings.Contains(e.Test, "/"):
			passed[e.Test] = true
			delete(outputs, id)
		case e.Action == "skip" && e.Test != "":
			skipped[top] = append(skipped[top], e.Test)
			delete(outputs, id)
		default:
			delete(outputs, id)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if guarantees == "" {
		return ok, nil
	}
	names, err := guaranteeTests(guarantees)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if !passed[n] {
			fmt.Fprintf(out, "guarantee test %s did not pass (%s)\n", n, guarantees)
			ok = false
		}
		if len(skipped[n]) > 0 {
			fmt.Fprintf(out, "guarantee test %s was skipped, in whole or in part: %s\n", n, strings.Join(skipped[n], ", "))
			ok = false
		}
	}
	if ok {
		fmt.Fprintf(out, "every test named in %s ran and passed (%d tests)\n", guarantees, len(names))
	}
	return ok, nil
}

var testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")

// guaranteeTests are the test names in the table rows of path's "## The
// tests" section.
func guaranteeTests(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	_, section, found := strings.Cut(string(b), "\n## The tests\n")
	if !found {
		return nil, fmt.Errorf("%s has no \"## The tests\" section", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| ") {
			for _, m := range testName.FindAllStringSubmatch(line, -1) {
				names = append(names, m[1])
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("%s names no test in its \"## The tests\" table", path)
	}
	return names, nil
}
