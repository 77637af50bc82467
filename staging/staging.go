// Package staging owns the layout of staged writes: the state a transaction
// has written but not yet committed. Staged writes live in their own bbolt
// bucket keyed by transaction first, so that committing or discarding a
// transaction is one prefix walk and a staged write is never visible to
// public readers. The state machine calls it inside its apply transaction;
// nothing here reads the clock or keeps state outside bbolt.
package staging

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Bucket is the bbolt bucket holding every staged write.
var Bucket = []byte("staging")

// Write is one staged change to a key: a new document or a removal.
type Write struct {
	Version  int64  `json:"version"`
	ETag     string `json:"etag,omitempty"`
	Deleted  bool   `json:"deleted,omitempty"`
	StagedAt int64  `json:"staged_at"`
	Doc      []byte `json:"-"`
}

// Area is the staging bucket seen through one bbolt transaction.
type Area struct{ b *bolt.Bucket }

// Init creates the staging bucket if it does not exist.
func Init(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(Bucket)
	return err
}

// In returns the staging area of tx. Init must have run on the database.
func In(tx *bolt.Tx) *Area { return &Area{b: tx.Bucket(Bucket)} }

func prefix(txn string) []byte { return append([]byte(txn), 0) }

func entryKey(txn, ns, key string) []byte {
	k := make([]byte, 0, len(txn)+len(ns)+len(key)+2)
	k = append(k, txn...)
	k = append(k, 0)
	k = append(k, ns...)
	k = append(k, 0)
	return append(k, key...)
}

// encode frames a write as its JSON header, a newline, then the raw document.
// JSON never contains a raw newline, so the first one ends the header.
func encode(w Write) ([]byte, error) {
	h, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(h)+1+len(w.Doc))
	out = append(out, h...)
	out = append(out, '\n')
	return append(out, w.Doc...), nil
}

func decode(v []byte) (Write, error) {
	var w Write
	i := bytes.IndexByte(v, '\n')
	if i < 0 {
		return w, fmt.Errorf("staging: malformed entry")
	}
	if err := json.Unmarshal(v[:i], &w); err != nil {
		return w, fmt.Errorf("staging: %w", err)
	}
	if !w.Deleted {
		w.Doc = bytes.Clone(v[i+1:])
	}
	return w, nil
}

// Put stages w for (ns, key) under txn, replacing any earlier staged write.
func (a *Area) Put(txn, ns, key string, w Write) error {
	v, err := encode(w)
	if err != nil {
		return err
	}
	return a.b.Put(entryKey(txn, ns, key), v)
}

// Get returns the write staged for (ns, key) under txn, if any.
func (a *Area) Get(txn, ns, key string) (Write, bool, error) {
	v := a.b.Get(entryKey(txn, ns, key))
	if v == nil {
		return Write{}, false, nil
	}
	w, err := decode(v)
	return w, err == nil, err
}

// Each visits every write staged under txn in key order.
func (a *Area) Each(txn string, fn func(ns, key string, w Write) error) error {
	p := prefix(txn)
	c := a.b.Cursor()
	for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
		rest := k[len(p):]
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return fmt.Errorf("staging: malformed key %q", k)
		}
		w, err := decode(v)
		if err != nil {
			return err
		}
		if err := fn(string(rest[:i]), string(rest[i+1:]), w); err != nil {
			return err
		}
	}
	return nil
}

// Delete drops txn's staged write for (ns, key), if any.
func (a *Area) Delete(txn, ns, key string) error {
	return a.b.Delete(entryKey(txn, ns, key))
}

// Discard deletes every write staged under txn.
func (a *Area) Discard(txn string) error {
	p := prefix(txn)
	var keys [][]byte
	c := a.b.Cursor()
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := a.b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Check reports the first staged entry of tx whose key or value does not
// decode (nil when every one does, or when tx has no staging bucket).
func Check(tx *bolt.Tx) error {
	b := tx.Bucket(Bucket)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if bytes.Count(k, []byte{0}) < 2 {
			return fmt.Errorf("staging: malformed key %q", k)
		}
		if _, err := decode(v); err != nil {
			return fmt.Errorf("staging: entry %q: %w", k, err)
		}
		return nil
	})
}

// CheckDocuments reports a staged document, of a bucket that passed Check,
// that does not match its ETag.
func CheckDocuments(tx *bolt.Tx) error {
	b := tx.Bucket(Bucket)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if w, _ := decode(v); !w.Deleted && !DocMatches(w.Doc, w.ETag) {
			return fmt.Errorf("staging: entry %q: the document does not match its etag", k)
		}
		return nil
	})
}

// DocMatches reports whether doc is a JSON document whose ETag (the hex
// SHA-256 of its bytes, as written) is etag: a check for documents that
// come from outside, such as a backup.
func DocMatches(doc []byte, etag string) bool {
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:]) == etag && json.Valid(doc)
}
