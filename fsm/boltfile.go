package fsm

import (
	"errors"
	"fmt"
	"os"
)

// ErrTruncated says that a bbolt file (the state file, the Raft log) is
// shorter than its own meta page says: a copy cut short, a disk that
// filled up, a file truncated by hand.
var ErrTruncated = errors.New("truncated")

// CheckFileLength refuses, with ErrTruncated, a bbolt file at path that is
// shorter than the pages its newest valid meta page says are in use.
// bbolt maps the file and reads those pages when it opens it for writing;
// past the end of the file that read is a memory fault in a goroutine of
// its own, which stops the process with a stack trace instead of an error.
// A missing or empty file (bbolt makes a new one) and a file without a
// valid meta page (bbolt refuses it itself) pass.
func CheckFileLength(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return nil
	}
	readMeta := func(off int64) (meta, bool) {
		b := make([]byte, metaSize)
		if _, err := f.ReadAt(b, off+pageHeaderSize); err != nil {
			return meta{}, false
		}
		return parseMeta(b)
	}
	m, ok := readMeta(0)
	pageSize := int64(os.Getpagesize())
	if ok {
		pageSize = int64(m.pageSize)
	}
	if m1, ok1 := readMeta(pageSize); ok1 && (!ok || m1.txn > m.txn) {
		m, ok = m1, true
	}
	if !ok {
		return nil
	}
	if need := int64(m.pages) * int64(m.pageSize); fi.Size() < need {
		return fmt.Errorf("%s is %w: it holds %d bytes, its pages reach to %d", path, ErrTruncated, fi.Size(), need)
	}
	return nil
}
