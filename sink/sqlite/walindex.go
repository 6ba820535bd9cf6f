package sqlite

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// The WAL-index header, as SQLite's unix VFS keeps it at the start of the
// -shm file (https://www.sqlite.org/walformat.html, "The WAL-Index Header";
// wal.c, WalIndexHdr): two copies of 48 bytes, the second written first.
// Every commit by any connection in any process changes it (iChange counts
// transactions, mxFrame and the checksums move with every frame, a WAL
// restart draws new salts), and it is written only after the commit's
// frames are in the WAL — synced first, under synchronous=FULL. A SQLite
// reader decides from this header alone whether the database changed since
// its last read; walIndex reads it for the same decision, without a read
// transaction (see rowCache).
const (
	walHdrSize    = 48
	walHdrVersion = 3007000 // iVersion of every WAL-index SQLite writes
	walHdrCksumAt = 40      // aCksum: the checksum of the bytes before it
	walHdrInitAt  = 12      // isInit: 1 once the header is valid
)

// walVersion is one WAL-index header. Equal versions read at two moments
// mean the same database: the header pins the WAL's content (its salts,
// its last valid frame, that frame's running checksum) and every commit
// moves it. A version never comes back: iChange only grows, and a WAL
// restart draws new salts.
type walVersion [walHdrSize]byte

// walIndex reads the WAL-index header of one database through a descriptor
// of its -shm file. SQLite's locks on -shm are POSIX record locks (modernc's
// OFD locking covers the database file only), and a close(2) of any
// descriptor of the file drops every one of them that this process holds:
// shmFiles keeps one descriptor per -shm file (device and inode), shared by
// the sinks that use it, and closes it only when it cannot hold up such a
// lock (see release).
type walIndex struct {
	id    [2]uint64
	users int // sinks using it, guarded by shmFiles
	mu    sync.Mutex
	fd    int // -1 once released
	buf   [2 * walHdrSize]byte
}

var shmFiles = struct {
	sync.Mutex
	m map[[2]uint64]*walIndex
}{m: map[[2]uint64]*walIndex{}}

// openWALIndex returns the walIndex of the database SQLite names path (see
// openOwnWALIndex), whose -shm file SQLite has opened already (the sink's
// connections are in WAL mode). Each walIndex it returns is released once
// (release).
func openWALIndex(path string) (*walIndex, error) {
	name := path + "-shm"
	shmFiles.Lock()
	defer shmFiles.Unlock()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if w := shmFiles.m[[2]uint64{uint64(st.Dev), uint64(st.Ino)}]; w != nil {
		w.users++
		return w, nil
	}
	// As SQLite opens it (no symbolic link), and never waiting: a FIFO
	// put in its place would block an open for reading forever.
	fd, err := syscall.Open(name, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// What was opened is what counts: the file may have been replaced
	// between the stat and the open.
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err) // fd stays open (see walIndex)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("%s: not a regular file", name) // fd stays open (see walIndex)
	}
	id := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
	if w := shmFiles.m[id]; w != nil {
		w.users++
		return w, nil // fd stays open (see walIndex)
	}
	w := &walIndex{id: id, fd: fd, users: 1}
	shmFiles.m[id] = w
	return w, nil
}

// release ends one sink's use of w, after that sink's connections are
// closed. The last user closes the descriptor when the -shm file is deleted
// (SQLite deletes it when the database's last connection closes) and no
// other descriptor of the process refers to it: no SQLite connection can
// then hold a lock on it, nor open it again by its name. Otherwise the
// descriptor stays open, as it did before: each Open and Close of a sink
// would keep one deleted -shm file, and a descriptor, for the process's life.
func (w *walIndex) release() {
	shmFiles.Lock()
	defer shmFiles.Unlock()
	if w.users--; w.users > 0 {
		return
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(w.fd, &st); err != nil || st.Nlink != 0 || otherDescriptor(w.fd, w.id) {
		return
	}
	w.mu.Lock()
	syscall.Close(w.fd)
	w.fd = -1
	w.mu.Unlock()
	delete(shmFiles.m, w.id)
}

// otherDescriptor reports whether a descriptor of this process other than
// fd refers to the file id (device and inode), or whether that cannot be
// known (no /proc).
func otherDescriptor(fd int, id [2]uint64) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return true
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == fd {
			continue
		}
		var st syscall.Stat_t
		if syscall.Fstat(n, &st) == nil && uint64(st.Dev) == id[0] && uint64(st.Ino) == id[1] {
			return true
		}
	}
	return false
}

// version reads the header; ok is false when it is not a valid, settled
// header (being written at this moment, not initialised, or not SQLite's).
func (w *walIndex) version() (v walVersion, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return v, false
	}
	n, err := syscall.Pread(w.fd, w.buf[:], 0)
	if err != nil || n != len(w.buf) {
		return v, false
	}
	return parseWALHeader(w.buf[:])
}

// parseWALHeader checks both copies of a WAL-index header (b: 96 bytes) as
// SQLite's walIndexTryHdr does: equal, initialised, and with the checksum
// SQLite computes in native byte order.
func parseWALHeader(b []byte) (v walVersion, ok bool) {
	if len(b) < 2*walHdrSize {
		return v, false
	}
	h0, h1 := b[:walHdrSize], b[walHdrSize:2*walHdrSize]
	if string(h0) != string(h1) || h0[walHdrInitAt] != 1 {
		return v, false
	}
	le := binary.NativeEndian
	if le.Uint32(h0[0:]) != walHdrVersion {
		return v, false
	}
	var s1, s2 uint32
	for i := 0; i < walHdrCksumAt; i += 8 {
		s1 += le.Uint32(h0[i:]) + s2
		s2 += le.Uint32(h0[i+4:]) + s1
	}
	if s1 != le.Uint32(h0[walHdrCksumAt:]) || s2 != le.Uint32(h0[walHdrCksumAt+4:]) {
		return v, false
	}
	copy(v[:], h0)
	return v, true
}
