package fsm

import (
	"encoding/binary"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// The page tree of a state file from elsewhere (a snapshot, a backup) is
// checked before bbolt walks it. bbolt trusts its pages: a damaged branch
// element that points back to one of its own ancestors sends a cursor
// round the loop for ever, growing its stack until the process runs out of
// memory. checkPages reads every page reachable from the root bucket once,
// straight from the file, and refuses a page referenced twice, one outside
// the file, one whose header names another page, an element that reaches
// past its page, and a page of the wrong kind.

// bbolt's page layout (go.etcd.io/bbolt/internal/common/page.go).
const (
	pageHeaderSize  = 16 // id u64, flags u16, count u16, overflow u32
	pageElementSize = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	branchPageFlag  = 0x01
	leafPageFlag    = 0x02
	bucketLeafFlag  = 0x01
	bucketHeader    = 16 // root pgid u64, sequence u64; an inline bucket's page follows
)

type pageWalk struct {
	f        *os.File
	pageSize uint64
	pages    uint64 // the high-water mark: pages 0..pages-1 are in use
	seen     map[uint64]bool
}

// checkPages checks the page tree of the file tx reads.
func checkPages(tx *bolt.Tx) error {
	_, err := walkPages(tx)
	return err
}

// walkPages checks the page tree of the file tx reads and returns the
// pages in it.
func walkPages(tx *bolt.Tx) (map[uint64]bool, error) {
	f, err := os.Open(tx.DB().Path())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	w := &pageWalk{f: f, pageSize: uint64(tx.DB().Info().PageSize), seen: map[uint64]bool{}}
	if w.pageSize < 512 {
		return nil, fmt.Errorf("page size %d", w.pageSize)
	}
	w.pages = uint64(tx.Size()) / w.pageSize
	if tx.Size() < 0 || w.pages*w.pageSize > uint64(fi.Size()) {
		return nil, fmt.Errorf("the file holds %d bytes, its meta page claims %d pages of %d", fi.Size(), w.pages, w.pageSize)
	}
	return w.seen, w.page(uint64(tx.Cursor().Bucket().Root()))
}

// page checks page id and everything below it.
func (w *pageWalk) page(id uint64) error {
	if id < 2 || id >= w.pages {
		return fmt.Errorf("page %d is outside the file's %d pages", id, w.pages)
	}
	hdr := make([]byte, pageHeaderSize)
	if _, err := w.f.ReadAt(hdr, int64(id*w.pageSize)); err != nil {
		return fmt.Errorf("page %d: %w", id, err)
	}
	overflow := uint64(binary.LittleEndian.Uint32(hdr[12:]))
	if got := binary.LittleEndian.Uint64(hdr); got != id {
		return fmt.Errorf("page %d says it is page %d", id, got)
	}
	if id+overflow >= w.pages {
		return fmt.Errorf("page %d runs past the file's %d pages", id, w.pages)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p] {
			return fmt.Errorf("page %d is referenced twice", p)
		}
		w.seen[p] = true
	}
	buf := make([]byte, (1+overflow)*w.pageSize)
	if _, err := w.f.ReadAt(buf, int64(id*w.pageSize)); err != nil {
		return fmt.Errorf("page %d: %w", id, err)
	}
	return w.node(id, buf)
}

// node checks the elements of page p (a page of the file, or an inline
// bucket's page inside its parent's value).
func (w *pageWalk) node(id uint64, p []byte) error {
	if len(p) < pageHeaderSize {
		return fmt.Errorf("page %d is cut short", id)
	}
	flags, count := binary.LittleEndian.Uint16(p[8:]), uint64(binary.LittleEndian.Uint16(p[10:]))
	if pageHeaderSize+count*pageElementSize > uint64(len(p)) {
		return fmt.Errorf("page %d: %d elements do not fit", id, count)
	}
	switch flags {
	case branchPageFlag:
		if count == 0 {
			return fmt.Errorf("branch page %d is empty", id)
		}
		for i := range count {
			at := pageHeaderSize + i*pageElementSize
			e := p[at:]
			pos, ksize := uint64(binary.LittleEndian.Uint32(e)), uint64(binary.LittleEndian.Uint32(e[4:]))
			if at+pos+ksize > uint64(len(p)) {
				return fmt.Errorf("page %d: element %d reaches past the page", id, i)
			}
			if err := w.page(binary.LittleEndian.Uint64(e[8:])); err != nil {
				return err
			}
		}
	case leafPageFlag:
		for i := range count {
			at := pageHeaderSize + i*pageElementSize
			e := p[at:]
			pos, ksize := uint64(binary.LittleEndian.Uint32(e[4:])), uint64(binary.LittleEndian.Uint32(e[8:]))
			vsize := uint64(binary.LittleEndian.Uint32(e[12:]))
			if at+pos+ksize+vsize > uint64(len(p)) {
				return fmt.Errorf("page %d: element %d reaches past the page", id, i)
			}
			if binary.LittleEndian.Uint32(e)&bucketLeafFlag == 0 {
				continue
			}
			v := p[at+pos+ksize : at+pos+ksize+vsize]
			if len(v) < bucketHeader {
				return fmt.Errorf("page %d: element %d is a bucket without a header", id, i)
			}
			var err error
			if root := binary.LittleEndian.Uint64(v); root == 0 {
				err = w.node(id, v[bucketHeader:])
			} else {
				err = w.page(root)
			}
			if err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("page %d has kind %#x where a branch or a leaf belongs", id, flags)
	}
	return nil
}
