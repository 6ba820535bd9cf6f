// Package results owns the results directory (spec §9, results): one file
// per batch, DIR/<name>.jsonl, that is either absent or complete.
//
// A Dir writes a batch's results — streamed by a callback, such as a
// download of the batch's responses file or its inlined responses rendered
// one JSON object per line — to a temporary file DIR/.<name>.<token>.tmp
// named for the writer's claim token, fsyncs it, renames it to the final
// name and fsyncs the directory. A file at the final name is therefore
// complete, and Write returns it without fetching again. A failed write
// removes its temporary file; Open removes those a crash left behind, but
// never one a live writer (in this process or another sharing the
// directory) still holds: writers hold an exclusive flock(2) on their
// temporary file, which the kernel drops when the process dies.
//
// Names: see FileName. The package knows nothing of the API or the sink;
// the caller says what to write and under which claim.
package results

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/canon"
)

// Ext ends every results file's name.
const Ext = ".jsonl"

// Fetch writes a batch's results to w, honouring ctx. Write gives it a
// writer on the temporary file; an error from it fails the write.
type Fetch func(ctx context.Context, w io.Writer) error

// Dir is an open results directory. Its methods are safe for concurrent
// use, and several processes may share one directory.
type Dir struct {
	path string
}

// Written is what Write did.
type Written struct {
	// Path is the final file: DIR/<name>.jsonl.
	Path string
	// Fetched is false when the file was already there (nothing fetched).
	Fetched bool
	// Size is the file's size in bytes.
	Size int64
}

// Open opens the results directory at path, creating it (mode 0700, and
// its parents) when missing, and removes the temporary files that writers
// which died left in it. The path is made absolute, so that the paths
// handed to effects stay valid whatever their working directory.
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("results: no directory given")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	if fi, err := os.Stat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return nil, fmt.Errorf("results: creating the results directory: %w", err)
		}
		// The new directory's own entry must survive a crash too.
		if err := syncDir(filepath.Dir(abs)); err != nil {
			return nil, fmt.Errorf("results: creating the results directory %s: %w", abs, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("results: %s is not a directory", abs)
	}
	d := &Dir{path: abs}
	if err := d.removeLeftovers(); err != nil {
		return nil, err
	}
	return d, nil
}

// Path returns the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// Write makes sure the results of id are in DIR/<name>.jsonl. When that
// file exists it is complete: Write returns it without calling fetch (after
// an fsync of the directory, in case its writer died before making the
// entry durable). Otherwise fetch streams the results into
// DIR/.<name>.<token>.tmp, which is fsynced, renamed to the final name, and
// the directory fsynced; only then does Write return.
//
// ctx bounds the whole write (the caller's --download-timeout): fetch gets
// it, every write to the file checks it, and a write whose ctx ended before
// the rename publishes nothing. On any failure the temporary file is
// removed and the error says what happened and where (a full disk: "no
// space left on device", naming the directory); it wraps the cause, so
// errors.Is sees fetch's own errors and syscall.ENOSPC.
//
// token is the claim's fencing token: two writers of the same id (two
// claims, one of them stale) never share a temporary file, and either may
// finish first — both write the same batch's complete results.
func (d *Dir) Write(ctx context.Context, id string, token int64, fetch Fetch) (Written, error) {
	name, err := FileName(id)
	if err != nil {
		return Written{}, err
	}
	if token < 0 {
		return Written{}, fmt.Errorf("results: token %d is negative", token)
	}
	final := filepath.Join(d.path, name+Ext)
	// A file at the final name is complete (after an fsync of the
	// directory, in case its writer died before making the entry durable).
	switch fi, err := os.Lstat(final); {
	case err == nil && !fi.Mode().IsRegular():
		return Written{}, fmt.Errorf("results: %s exists but is not a regular file (%v); remove it", final, fi.Mode().Type())
	case err == nil:
		if err := syncDir(d.path); err != nil {
			return Written{}, fmt.Errorf("results: fsync of %s: %w", d.path, err)
		}
		return Written{Path: final, Size: fi.Size()}, nil
	case !errors.Is(err, fs.ErrNotExist):
		return Written{}, fmt.Errorf("results: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Written{}, fmt.Errorf("results: writing %s in %s: %w", name+Ext, d.path, err)
	}
	tmpName := "." + name + "." + strconv.FormatInt(token, 10) + ".tmp"
	tmp := filepath.Join(d.path, tmpName)
	f, err := createLocked(tmp)
	if err != nil {
		return Written{}, fmt.Errorf("results: writing %s in %s: %w", name+Ext, d.path, err)
	}
	fail := func(what string, cause error) (Written, error) {
		rerr := os.Remove(tmp)
		f.Close()
		msg := fmt.Sprintf("results: writing %s in %s: %s", name+Ext, d.path, what)
		if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return Written{}, fmt.Errorf("%s: %w (and the temporary file %s could not be removed: %v)", msg, cause, tmpName, rerr)
		}
		return Written{}, fmt.Errorf("%s: %w", msg, cause)
	}
	cw := &checkedWriter{ctx: ctx, f: f}
	bw := bufio.NewWriterSize(cw, 256<<10)
	ferr := fetch(ctx, bw)
	if ferr == nil {
		ferr = bw.Flush()
	}
	switch {
	case cw.err != nil: // the file's own error (a full disk) is the cause, however fetch wrapped it
		return fail("writing the temporary file", cw.err)
	case ferr != nil:
		return fail("fetching", ferr)
	}
	if err := f.Sync(); err != nil {
		return fail("fsync", err)
	}
	if err := ctx.Err(); err != nil {
		return fail("before the rename", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail("rename", err)
	}
	// The lock is held until here, so that Open in another process never
	// removes the file before the rename.
	f.Close()
	if err := syncDir(d.path); err != nil {
		// The file is complete at its final name; only the entry's
		// durability is in doubt. A retry finds it and syncs again.
		return Written{}, fmt.Errorf("results: wrote %s in %s, but the directory fsync failed: %w", name+Ext, d.path, err)
	}
	return Written{Path: final, Fetched: true, Size: cw.n}, nil
}

// Remove deletes the results file of id (purge --results-dir) and reports
// whether there was one. A missing file is not an error.
func (d *Dir) Remove(id string) (bool, error) {
	name, err := FileName(id)
	if err != nil {
		return false, err
	}
	final := filepath.Join(d.path, name+Ext)
	if err := os.Remove(final); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("results: removing %w", err)
	}
	if err := syncDir(d.path); err != nil {
		return true, fmt.Errorf("results: removed %s, but the directory fsync failed: %w", final, err)
	}
	return true, nil
}

// Lines is a Fetch that writes items one JSON object per line, each
// compacted onto its line (a batch's inlined responses, in the shape of a
// responses file's lines). An item that is not a JSON object fails it.
func Lines(items []json.RawMessage) Fetch {
	return func(ctx context.Context, w io.Writer) error {
		var line bytes.Buffer
		for i, it := range items {
			if err := ctx.Err(); err != nil {
				return err
			}
			line.Reset()
			if err := json.Compact(&line, it); err != nil {
				return fmt.Errorf("results: inlined response %d is not JSON: %w", i, err)
			}
			if line.Len() == 0 || line.Bytes()[0] != '{' {
				return fmt.Errorf("results: inlined response %d is not a JSON object", i)
			}
			line.WriteByte('\n')
			if _, err := w.Write(line.Bytes()); err != nil {
				return err
			}
		}
		return nil
	}
}

// checkedWriter writes to the temporary file, stops once ctx ends, and
// keeps the file's first error so Write can name the real cause.
type checkedWriter struct {
	ctx context.Context
	f   *os.File
	n   int64
	err error
}

func (w *checkedWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if err := w.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := w.f.Write(p)
	w.n += int64(n)
	if err != nil {
		w.err = err
	}
	return n, err
}

// createLocked creates path exclusively and takes an exclusive flock on
// it. A file already there whose lock is free belongs to a writer that
// died with this token: it is replaced. One whose lock is held belongs to
// a live writer: an error.
func createLocked(path string) (*os.File, error) {
	for range 3 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			removed, rerr := removeIfUnlocked(path)
			if rerr != nil {
				return nil, rerr
			}
			if !removed {
				return nil, fmt.Errorf("%s is being written by another writer with the same token", filepath.Base(path))
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			os.Remove(path)
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		// Open in another process may have removed the file between the
		// create and the lock: then the lock is on an inode no name points
		// to, and the rename would fail. Start again.
		if same, err := samePath(f, path); err != nil {
			f.Close()
			return nil, err
		} else if !same {
			f.Close()
			continue
		}
		return f, nil
	}
	return nil, fmt.Errorf("%s: could not create and lock it (removed under us three times)", filepath.Base(path))
}

func samePath(f *os.File, path string) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	pi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(fi, pi), nil
}

// removeIfUnlocked removes a temporary file no live writer holds, under
// its lock (so that no writer can take it meanwhile).
func removeIfUnlocked(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("flock %s: %w", path, err)
	}
	if same, err := samePath(f, path); err != nil || !same {
		return err == nil, err // gone or replaced meanwhile: not ours to remove
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// removeLeftovers removes the temporary files of writers that died.
func (d *Dir) removeLeftovers() error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("results: reading the results directory: %w", err)
	}
	removed := false
	for _, e := range entries {
		if !e.Type().IsRegular() || !isTempName(e.Name()) {
			continue
		}
		ok, err := removeIfUnlocked(filepath.Join(d.path, e.Name()))
		if err != nil {
			return fmt.Errorf("results: removing the leftover %s: %w", e.Name(), err)
		}
		removed = removed || ok
	}
	if removed {
		if err := syncDir(d.path); err != nil {
			return fmt.Errorf("results: fsync of %s: %w", d.path, err)
		}
	}
	return nil
}

// isTempName matches ".<name>.<token>.tmp" with a name FileName can make.
func isTempName(s string) bool {
	rest, ok := strings.CutPrefix(s, ".")
	if rest, ok2 := strings.CutSuffix(rest, ".tmp"); ok && ok2 {
		i := strings.LastIndexByte(rest, '.')
		_, err := strconv.ParseUint(rest[i+1:], 10, 64)
		return i > 0 && err == nil && validName(rest[:i])
	}
	return false
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// maxName bounds an encoded name, so that the longest temporary name
// (".<name>.<token>.tmp", a token of up to 19 digits) stays well under the
// 255-byte file name limit of common file systems.
const maxName = 200

// hashedKeep is how much of a too-long encoding a hashed name keeps.
const hashedKeep = maxName - 1 - hashHex

// hashHex is the length of the SHA-256 prefix (160 bits) in hashed names.
const hashHex = 40

// FileName returns the file name stem for an id (the results file is
// FileName(id) + ".jsonl"), safe on any file system whatever the id — spec
// §12 allows up to 512 bytes of any printable UTF-8, while batch ids are
// normally [a-z0-9-]:
//
//   - the bytes a-z, 0-9, '-' and '_' stand for themselves;
//   - every other byte is written "%xx", two lower-case hex digits (so
//     "batch.A/b" is "batch%2e%41%2fb"). The result never starts with '.',
//     holds no '/', no upper case (two ids never meet on a case-insensitive
//     file system) and decodes back to the id exactly (the tests' IDOf);
//   - an encoding longer than 200 bytes is cut to its first 159 bytes (at a
//     whole escape), followed by '~' and the first 40 hex digits of the id's
//     SHA-256: still unique, no longer reversible.
//
// An empty id, or one that is not valid UTF-8, is an error.
func FileName(id string) (string, error) {
	switch {
	case id == "":
		return "", errors.New("results: an empty id")
	case !utf8.ValidString(id):
		return "", fmt.Errorf("results: id %s is not valid UTF-8", canon.Quote(id))
	}
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02x", c)
	}
	s := b.String()
	if len(s) <= maxName {
		return s, nil
	}
	keep := hashedKeep
	// Never cut inside an escape.
	if i := strings.LastIndexByte(s[:keep], '%'); i >= keep-2 {
		keep = i
	}
	sum := sha256.Sum256([]byte(id))
	return s[:keep] + "~" + hex.EncodeToString(sum[:])[:hashHex], nil
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// validName reports whether s has the shape of a FileName result: plain
// bytes and well-formed lower-case escapes, then possibly '~' and 40 hex
// digits after a cut encoding.
func validName(s string) bool {
	m := nameShape.FindStringSubmatch(s)
	return m != nil && s != "" && len(s) <= maxName && (m[2] == "" || len(m[1]) <= hashedKeep)
}

var nameShape = regexp.MustCompile(`^((?:[a-z0-9_-]|%[0-9a-f]{2})*)(~[0-9a-f]{40})?$`)
