package sqlite

import (
	"encoding/binary"
	"fmt"
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
// of its -shm file that this process never closes: SQLite's locks on -shm
// are POSIX record locks (modernc's OFD locking covers the database file
// only), and a close(2) of any descriptor of the file would drop every one
// of them that this process holds. shmFiles keeps one descriptor per -shm
// file (device and inode) for the life of the process.
type walIndex struct {
	fd  int
	buf [2 * walHdrSize]byte
	mu  sync.Mutex
}

var shmFiles = struct {
	sync.Mutex
	m map[[2]uint64]*walIndex
}{m: map[[2]uint64]*walIndex{}}

// openWALIndex returns the walIndex of the database at path, whose -shm file
// SQLite has opened already (the sink's connections are in WAL mode).
func openWALIndex(path string) (*walIndex, error) {
	name := path + "-shm"
	shmFiles.Lock()
	defer shmFiles.Unlock()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if w := shmFiles.m[[2]uint64{uint64(st.Dev), uint64(st.Ino)}]; w != nil {
		return w, nil
	}
	fd, err := syscall.Open(name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// What was opened is what counts: the file may have been replaced
	// between the stat and the open.
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err) // fd stays open (see walIndex)
	}
	id := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
	if w := shmFiles.m[id]; w != nil {
		return w, nil // fd stays open (see walIndex)
	}
	w := &walIndex{fd: fd}
	shmFiles.m[id] = w
	return w, nil
}

// version reads the header; ok is false when it is not a valid, settled
// header (being written at this moment, not initialised, or not SQLite's).
func (w *walIndex) version() (v walVersion, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
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
