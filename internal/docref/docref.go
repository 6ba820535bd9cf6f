// Package docref checks that the repository's references to its own
// documentation resolve, so that a comment never points at a rule nobody can
// read: every section reference ("spec §N", "§N.M") in a Go file must name a
// numbered heading ("## §N …", "### §N.M …") of a Markdown file under docs/,
// and every docs/… path that a Go comment cites must exist. Its test runs
// the check on this module; the package holds no state.
package docref

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Problem is one reference that does not resolve, or one section number
// that more than one heading claims.
type Problem struct {
	File   string // slash-separated, relative to the module root
	Line   int
	Target string // "§N.M", or a docs/… path
	Why    string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Target, p.Why)
}

// Report is what Check found.
type Report struct {
	Problems []Problem
	Refs     int // section references and docs/ paths looked at
	Headings int // numbered headings under docs/
}

var (
	// sectionRef is a section reference: "§" and a number such as 5, 5.5.
	sectionRef = regexp.MustCompile(`§\s*([0-9]+(?:\.[0-9]+)*)`)
	// foreignRef ends the text before a reference to another document's
	// sections ("RFC 9110" before the section sign), which docs/ does not hold.
	foreignRef = regexp.MustCompile(`(?i)\bRFC[ -]?[0-9]+[ ,]*$`)
	// heading is a Markdown heading that carries a section number.
	heading = regexp.MustCompile(`^#{1,6}[ \t]+§([0-9]+(?:\.[0-9]+)*)(?:[ \t]|$)`)
	// docsPath is a docs/… path; its last byte is never '.' or '/' (the end
	// of a sentence, or a directory written with its slash).
	docsPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-])`)
)

// ModuleRoot returns the nearest directory at or above dir that holds a
// go.mod file.
func ModuleRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("docref: no go.mod at or above %s", dir)
		}
		d = parent
	}
}

// Headings returns every section number that a heading of a Markdown file
// under root/docs carries, with the file:line of its first heading, and a
// Problem for each further heading with a number already taken. Headings
// inside fenced code blocks do not count.
func Headings(root string) (map[string]string, []Problem, error) {
	found := map[string]string{}
	var dups []Problem
	dir := filepath.Join(root, "docs")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path == dir {
				return fs.SkipDir // no docs/ at all: every reference fails
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel := relSlash(root, path)
		fenced := false
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			m := heading.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			where := fmt.Sprintf("%s:%d", rel, n)
			if first, ok := found[m[1]]; ok {
				dups = append(dups, Problem{File: rel, Line: n, Target: "§" + m[1],
					Why: "a second heading with this section number (the first is at " + first + "): a reference could mean either"})
				continue
			}
			found[m[1]] = where
		}
		return sc.Err()
	})
	return found, dups, err
}

// Check scans every .go file under root (skipping testdata, vendor and
// directories whose name starts with "." or "_", as the go command does) for
// section references that no heading under docs/ carries, and every Go
// comment for docs/… paths that do not exist.
func Check(root string) (Report, error) {
	var r Report
	heads, dups, err := Headings(root)
	if err != nil {
		return r, err
	}
	r.Headings = len(heads)
	r.Problems = append(r.Problems, dups...)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel := relSlash(root, path)
		n, ps := sectionProblems(rel, src, heads)
		r.Refs += n
		r.Problems = append(r.Problems, ps...)
		n, ps, err = pathProblems(root, rel, src)
		if err != nil {
			return err
		}
		r.Refs += n
		r.Problems = append(r.Problems, ps...)
		return nil
	})
	sort.SliceStable(r.Problems, func(i, j int) bool {
		a, b := r.Problems[i], r.Problems[j]
		if a.File != b.File {
			return a.File < b.File
		}
		return a.Line < b.Line
	})
	return r, err
}

// sectionProblems checks every section reference in src, comments and
// string literals alike (a message may cite a rule too).
func sectionProblems(rel string, src []byte, heads map[string]string) (int, []Problem) {
	var refs int
	var ps []Problem
	for i, line := range strings.Split(string(src), "\n") {
		for _, m := range sectionRef.FindAllStringSubmatchIndex(line, -1) {
			if foreignRef.MatchString(line[:m[0]]) {
				continue
			}
			refs++
			num := line[m[2]:m[3]]
			if _, ok := heads[num]; !ok {
				ps = append(ps, Problem{File: rel, Line: i + 1, Target: "§" + num,
					Why: "no heading under docs/ carries this section number (want a heading such as \"## §" + num + " …\" in docs/*.md)"})
			}
		}
	}
	return refs, ps
}

// pathProblems checks every docs/… path cited in a comment of src.
func pathProblems(root, rel string, src []byte) (int, []Problem, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return 0, nil, fmt.Errorf("docref: %w", err)
	}
	var refs int
	var ps []Problem
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			first := fset.Position(c.Slash).Line
			for i, line := range strings.Split(c.Text, "\n") {
				for _, m := range docsPath.FindAllStringSubmatch(line, -1) {
					refs++
					p := m[1]
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
						ps = append(ps, Problem{File: rel, Line: first + i, Target: p,
							Why: "the comment cites a file that does not exist"})
					}
				}
			}
		}
	}
	return refs, ps, nil
}

func relSlash(root, path string) string {
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return filepath.ToSlash(path)
	}
	return filepath.ToSlash(rel)
}
