package sink

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// Migration is one schema step of a backend (spec §3, "Schema versions and
// migrations"): a file NNNN_description.sql whose number is its Version and
// whose first line, "-- min_reader: N", is its MinReader — the oldest
// schema version a binary must know to use the database once the step is
// applied (an additive step keeps its predecessor's). Both backends read
// their embedded migrations with LoadMigrations, so the rules are the same.
type Migration struct {
	Version   int
	MinReader int
	Name      string // the file's name
	SQL       string
}

// MinReaderPrefix starts the first line of every migration file.
const MinReaderPrefix = "-- min_reader:"

// ParseMigration reads a migration file's version (from its name) and
// minimum reader (from its first line, between 1 and the version).
func ParseMigration(base, text string) (Migration, error) {
	num, _, ok := strings.Cut(base, "_")
	v, err := strconv.Atoi(num)
	if !ok || err != nil || v < 1 {
		return Migration{}, fmt.Errorf("migration %s: the name must start with a version number", base)
	}
	first, _, _ := strings.Cut(text, "\n")
	n, ok := strings.CutPrefix(strings.TrimSpace(first), MinReaderPrefix)
	mr, err := strconv.Atoi(strings.TrimSpace(n))
	if !ok || err != nil || mr < 1 || mr > v {
		return Migration{}, fmt.Errorf("migration %s: the first line must be %q with 1 <= N <= %d, got %q", base, MinReaderPrefix+" N", v, first)
	}
	return Migration{Version: v, MinReader: mr, Name: base, SQL: text}, nil
}

// LoadMigrations parses the migrations/*.sql files of fsys in version
// order and checks the whole: versions 1..n, minimum readers never falling.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		m, err := ParseMigration(strings.TrimPrefix(name, "migrations/"), string(b))
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: want version %d", m.Name, i+1)
		}
		if i > 0 && m.MinReader < ms[i-1].MinReader {
			return nil, fmt.Errorf("migration %s: min_reader %d is below its predecessor's %d", m.Name, m.MinReader, ms[i-1].MinReader)
		}
	}
	return ms, nil
}

// CheckReader is the rule of spec §3 for a schema newer than a binary: a
// binary that knows versions up to latest uses schema version cur unless
// its minimum reader mr is newer (or the database records none: ok false).
func CheckReader(cur, mr int, ok bool, latest int) error {
	switch {
	case cur <= latest:
		return nil
	case !ok:
		return fmt.Errorf("schema version %d records no minimum reader, and this gemrecon knows versions up to %d (upgrade gemrecon): %w",
			cur, latest, ErrSchemaTooNew)
	case mr > latest:
		return fmt.Errorf("schema version %d needs a gemrecon that knows schema version %d or later (its minimum reader), and this one knows versions up to %d (upgrade gemrecon): %w",
			cur, mr, latest, ErrSchemaTooNew)
	}
	return nil
}
