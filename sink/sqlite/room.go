package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrNoRoom is wrapped by the errors of a write that failed because the
// database could not grow: the disk is full, or a file-size or disk-quota
// limit is reached. Nothing of the failed write was committed (SQLite rolled
// it back), and the sink stays usable: once there is room again, the next
// write succeeds (nothing needs a restart).
var ErrNoRoom = errors.New("no room to grow the database")

// maxWrite bounds one write of SQLite to a database, WAL or shared-memory
// file: a WAL frame of the largest page size (64 KiB and a 24-byte header).
// A file closer than that to the file-size limit cannot take the next write.
const maxWrite = 64<<10 + 24

// noRoomError turns SQLite's error for a write the file system refused into
// one line that names the cause and what to do, or returns nil when se is not
// such an error. SQLITE_FULL is what SQLite makes of ENOSPC (and of a write
// cut short at a limit); EFBIG (a file-size limit) and EDQUOT (a quota) come
// out as SQLITE_IOERR_WRITE or _TRUNCATE, like a failing disk's EIO: the
// driver does not pass the errno on, so the cause is looked for
// (roomCause), and an I/O error without one is said to be what it may be.
// A failed fsync (SQLITE_IOERR_FSYNC) is not one of these: it leaves the
// commit's outcome unknown, and is reported as it is. Nor is a shared-memory
// file that cannot grow (SQLITE_IOERR_SHMSIZE): SQLite may meet it after the
// commit's frames are in the WAL.
func noRoomError(path string, err error, se *msqlite.Error) error {
	code := se.Code()
	if code&0xff != sqlite3.SQLITE_FULL && code != sqlite3.SQLITE_IOERR_WRITE && code != sqlite3.SQLITE_IOERR_TRUNCATE {
		return nil
	}
	cause, todo := roomCause(path)
	if cause == "" {
		if code&0xff != sqlite3.SQLITE_FULL {
			return fmt.Errorf("sqlite sink %s: writing the database failed, though the disk is not full and no file-size limit is reached: "+
				"a disk quota may be (free space, then try again), or the disk is failing (see the system log); nothing of this write was committed: %w",
				path, err)
		}
		cause, todo = "the disk is full, or a file-size or disk-quota limit is reached", "free space or raise the limit"
	}
	return fmt.Errorf("sqlite sink %s: %w (%s): %s, then try again; nothing of this write was committed: %w",
		path, ErrNoRoom, cause, todo, err)
}

// roomCause names what keeps the database at path from growing, and what to
// do about it, or returns "": a file of the database within one write of
// this process's file-size limit (RLIMIT_FSIZE), or a file system without
// room for one more write.
func roomCause(path string) (cause, todo string) {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_FSIZE, &rl) == nil && rl.Cur != ^uint64(0) {
		// The WAL first: in WAL mode, commits append to it; the database
		// file grows only at checkpoints, whose errors SQLite keeps.
		for _, f := range []string{path + "-wal", path, path + "-journal", path + "-shm"} {
			if fi, err := os.Stat(f); err == nil && uint64(fi.Size())+maxWrite > rl.Cur {
				return fmt.Sprintf("%s is %d bytes, at this process's file-size limit of %d bytes", f, fi.Size(), rl.Cur),
					"raise the limit (RLIMIT_FSIZE: `ulimit -f`, systemd's LimitFSIZE=)"
			}
		}
	}
	dir := filepath.Dir(path)
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil {
		blocks := uint64(st.Bavail)
		if os.Geteuid() == 0 {
			blocks = uint64(st.Bfree) // root may use the reserved blocks
		}
		if free := blocks * uint64(st.Bsize); free < maxWrite {
			return fmt.Sprintf("the disk is full: %d bytes free on the file system of %s", free, dir), "free space"
		}
	}
	return "", ""
}
