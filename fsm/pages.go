package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
)

// The page tree of a state file from elsewhere (a snapshot, a backup) is
// checked before bbolt walks it or opens it for writing. bbolt trusts its
// pages:
//   - a branch element that points back at an ancestor sends a cursor
//     round the loop for ever, growing its stack until the process runs
//     out of memory;
//   - opening a file without a stored freelist for writing rebuilds the
//     freelist by checking every page in a goroutine of bbolt's own that
//     panics, killing the process, on the first key out of order;
//   - a stored freelist that lists pages in use hands them out again, and
//     the first write overwrites live data.
//
// checkPages reads every page reachable from the root bucket once,
// straight from the file, and refuses what bbolt's own check would report
// (a page referenced twice, outside the file or of the wrong kind, keys out
// of order within a page or with its ancestors' keys) and more: a page
// whose header names another page, elements that reach past their page,
// and a stored freelist that names a page in use or outside the file.

// bbolt's file layout (go.etcd.io/bbolt/internal/common).
const (
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	pageElementSize  = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	bucketHeader     = 16 // root pgid u64, sequence u64; an inline bucket's page follows
	noFreelist       = 1<<64 - 1
	metaMagic        = 0xED0CDAED
	metaVersion      = 2
	metaSize         = 64 // magic, version, page size, flags u32; root, sequence, freelist, pgid, txid, checksum u64
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

// walkPages checks the page tree and the freelist of the file tx reads and
// returns the pages in use: the tree's and the freelist's own.
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
	root := uint64(tx.Cursor().Bucket().Root())
	freelist, err := w.freelistPage(uint64(tx.ID()), root)
	if err != nil {
		return nil, err
	}
	if _, err := w.page(root, nil, nil); err != nil {
		return nil, err
	}
	return w.seen, w.freelist(freelist)
}

// meta is what checkPages and SnapshotSize use of a bbolt meta page.
type meta struct {
	pageSize                   uint32
	root, freelist, pages, txn uint64
}

// parseMeta reads a meta page's body (after its page header); ok is false
// unless its magic, version and checksum are right.
func parseMeta(m []byte) (meta, bool) {
	if len(m) < metaSize {
		return meta{}, false
	}
	h := fnv.New64a()
	h.Write(m[:56])
	le := binary.LittleEndian
	ok := le.Uint32(m) == metaMagic && le.Uint32(m[4:]) == metaVersion && le.Uint64(m[56:]) == h.Sum64()
	return meta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), pages: le.Uint64(m[40:]),
		txn: le.Uint64(m[48:])}, ok
}

// SnapshotHeaderBytes is how much of a state file SnapshotSize reads.
const SnapshotHeaderBytes = pageHeaderSize + metaSize

// SnapshotSize is the size a state file as a snapshot stream carries it
// (the pages in use, written whole) says it has, read from its first
// SnapshotHeaderBytes: an error when they are not a bbolt meta page.
func SnapshotSize(head []byte) (int64, error) {
	if len(head) < SnapshotHeaderBytes {
		return 0, errcode.InvalidSnapshot.With("not a raftlockd state file: %d bytes", len(head))
	}
	m, ok := parseMeta(head[pageHeaderSize:])
	if !ok || m.pageSize < 512 || m.pageSize > 1<<24 || m.pages < 2 || m.pages > 1<<40/uint64(m.pageSize) {
		return 0, errcode.InvalidSnapshot.With("not a raftlockd state file: its first page is not a bbolt meta page")
	}
	return int64(m.pages) * int64(m.pageSize), nil
}

// freelistPage returns the freelist page named by the meta page bbolt
// chose: the valid one of transaction txid with this root.
func (w *pageWalk) freelistPage(txid, root uint64) (uint64, error) {
	for i := range uint64(2) {
		b := make([]byte, metaSize)
		if _, err := w.f.ReadAt(b, int64(i*w.pageSize+pageHeaderSize)); err != nil {
			continue
		}
		if m, ok := parseMeta(b); ok && m.txn == txid && m.root == root {
			return m.freelist, nil
		}
	}
	return 0, fmt.Errorf("no meta page names transaction %d", txid)
}

// read marks page id (and its overflow) as seen and returns its bytes.
func (w *pageWalk) read(id uint64) ([]byte, error) {
	if id < 2 || id >= w.pages {
		return nil, fmt.Errorf("page %d is outside the file's %d pages", id, w.pages)
	}
	buf := make([]byte, w.pageSize)
	if _, err := w.f.ReadAt(buf, int64(id*w.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	overflow := uint64(binary.LittleEndian.Uint32(buf[12:]))
	if got := binary.LittleEndian.Uint64(buf); got != id {
		return nil, fmt.Errorf("page %d says it is page %d", id, got)
	}
	if id+overflow >= w.pages {
		return nil, fmt.Errorf("page %d runs past the file's %d pages", id, w.pages)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p] {
			return nil, fmt.Errorf("page %d is referenced twice", p)
		}
		w.seen[p] = true
	}
	if overflow > 0 {
		buf = append(buf, make([]byte, overflow*w.pageSize)...)
		if _, err := w.f.ReadAt(buf[w.pageSize:], int64((id+1)*w.pageSize)); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return buf, nil
}

// page checks page id and everything below it; its keys must lie in
// [lo, hi) (nil: unbounded). It returns the last key of its subtree.
func (w *pageWalk) page(id uint64, lo, hi []byte) ([]byte, error) {
	buf, err := w.read(id)
	if err != nil {
		return nil, err
	}
	return w.node(id, buf, lo, hi, true)
}

// node checks the elements of page p: a page of the file, or an inline
// bucket's page inside its parent's value, whose keys bbolt does not check
// (ordered false).
func (w *pageWalk) node(id uint64, p []byte, lo, hi []byte, ordered bool) (last []byte, err error) {
	if len(p) < pageHeaderSize {
		return nil, fmt.Errorf("page %d is cut short", id)
	}
	flags, count := binary.LittleEndian.Uint16(p[8:]), uint64(binary.LittleEndian.Uint16(p[10:]))
	if pageHeaderSize+count*pageElementSize > uint64(len(p)) {
		return nil, fmt.Errorf("page %d: %d elements do not fit", id, count)
	}
	key := func(i, pos, ksize uint64) ([]byte, error) {
		at := pageHeaderSize + i*pageElementSize + pos
		if at+ksize > uint64(len(p)) {
			return nil, fmt.Errorf("page %d: element %d reaches past the page", id, i)
		}
		return p[at : at+ksize], nil
	}
	inOrder := func(i uint64, k, prev []byte) error {
		switch {
		case !ordered:
		case i == 0 && prev != nil && bytes.Compare(prev, k) > 0,
			i > 0 && bytes.Compare(prev, k) >= 0,
			hi != nil && bytes.Compare(k, hi) >= 0:
			return fmt.Errorf("page %d: key %d is out of order", id, i)
		}
		return nil
	}
	switch flags {
	case branchPageFlag:
		if count == 0 {
			return nil, fmt.Errorf("branch page %d is empty", id)
		}
		keys := make([][]byte, count)
		for i := range count {
			e := p[pageHeaderSize+i*pageElementSize:]
			if keys[i], err = key(i, uint64(binary.LittleEndian.Uint32(e)), uint64(binary.LittleEndian.Uint32(e[4:]))); err != nil {
				return nil, err
			}
		}
		prev := lo
		for i := range count {
			if err := inOrder(i, keys[i], prev); err != nil {
				return nil, err
			}
			next := hi
			if i+1 < count {
				next = keys[i+1]
			}
			e := p[pageHeaderSize+i*pageElementSize:]
			if last, err = w.page(binary.LittleEndian.Uint64(e[8:]), keys[i], next); err != nil {
				return nil, err
			}
			prev = last
		}
		return last, nil
	case leafPageFlag:
		prev := lo
		for i := range count {
			e := p[pageHeaderSize+i*pageElementSize:]
			pos, ksize := uint64(binary.LittleEndian.Uint32(e[4:])), uint64(binary.LittleEndian.Uint32(e[8:]))
			vsize := uint64(binary.LittleEndian.Uint32(e[12:]))
			kv, err := key(i, pos, ksize+vsize)
			if err != nil {
				return nil, err
			}
			k, v := kv[:ksize], kv[ksize:]
			if err := inOrder(i, k, prev); err != nil {
				return nil, err
			}
			prev, last = k, k
			if binary.LittleEndian.Uint32(e)&bucketLeafFlag == 0 {
				continue
			}
			if len(v) < bucketHeader {
				return nil, fmt.Errorf("page %d: element %d is a bucket without a header", id, i)
			}
			if root := binary.LittleEndian.Uint64(v); root == 0 {
				_, err = w.node(id, v[bucketHeader:], nil, nil, false)
			} else {
				_, err = w.page(root, nil, nil)
			}
			if err != nil {
				return nil, err
			}
		}
		return last, nil
	}
	return nil, fmt.Errorf("page %d has kind %#x where a branch or a leaf belongs", id, flags)
}

// freelist checks the stored freelist at page id, if the file has one:
// every page it lists is inside the file and not in the tree.
func (w *pageWalk) freelist(id uint64) error {
	if id == noFreelist {
		return nil
	}
	buf, err := w.read(id)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if binary.LittleEndian.Uint16(buf[8:]) != freelistPageFlag {
		return fmt.Errorf("freelist page %d is not a freelist", id)
	}
	count, at := uint64(binary.LittleEndian.Uint16(buf[10:])), uint64(pageHeaderSize)
	if count == 0xFFFF {
		count, at = binary.LittleEndian.Uint64(buf[pageHeaderSize:]), pageHeaderSize+8
	}
	if count > (uint64(len(buf))-at)/8 {
		return fmt.Errorf("freelist page %d: %d ids do not fit", id, count)
	}
	for i := range count {
		free := binary.LittleEndian.Uint64(buf[at+8*i:])
		if free < 2 || free >= w.pages || w.seen[free] {
			return fmt.Errorf("freelist page %d lists page %d, which is in use or outside the file", id, free)
		}
	}
	return nil
}
