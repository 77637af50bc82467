package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// Backups are state files: a snapshot streams the bbolt file, and a restore
// swaps one in. A file that arrives from outside (an operator's backup) is
// checked before anything trusts it, because a damaged file handed to raft
// would stop every node that installs it.

// guard runs fn, turning a panic or a memory fault while bbolt reads a
// damaged file into invalid_snapshot.
func guard(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			// A fault inside bbolt says nothing to whoever sent the file.
			if _, fault := r.(runtime.Error); fault {
				r = "a page does not read back"
			}
			err = errcode.InvalidSnapshot.With("the state file is damaged or truncated: %v", r)
		}
	}()
	return fn()
}

// CheckStateFile reports whether the file at path is a raftlockd state
// file: a bbolt file whose pages all read back, holding the state machine's
// buckets, an applied index and well-formed key records. Anything else is
// errcode.InvalidSnapshot. It returns the applied index recorded in the file.
func CheckStateFile(path string) (applied uint64, err error) { return checkStateFile(path, false) }

// CheckBackupFile is CheckStateFile for a file from outside the cluster
// (an operator's backup): it also matches every document and message
// payload against the records that describe them, so that damage in them
// is refused instead of served.
func CheckBackupFile(path string) (applied uint64, err error) { return checkStateFile(path, true) }

// viewStateFile opens the file at path read-only and runs fn in a read
// transaction, under guard.
func viewStateFile(path string, fn func(tx *bolt.Tx) error) error {
	return guard(func() error {
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
		if err != nil {
			return errcode.InvalidSnapshot.With("not a raftlockd state file: %v", err)
		}
		defer db.Close()
		return db.View(fn)
	})
}

func checkStateFile(path string, contents bool) (applied uint64, err error) {
	err = viewStateFile(path, func(tx *bolt.Tx) error {
		if err := checkPages(tx); err != nil {
			return errcode.InvalidSnapshot.With("the state file is damaged: %v", err)
		}
		for _, name := range [][]byte{bucketMeta, bucketKeys, bucketDocs} {
			if tx.Bucket(name) == nil {
				return errcode.InvalidSnapshot.With("not a raftlockd state file: no %q bucket", name)
			}
		}
		v := tx.Bucket(bucketMeta).Get(metaApplied)
		if v != nil && len(v) != 16 {
			return errcode.InvalidSnapshot.With("not a raftlockd state file: malformed applied index")
		}
		applied = u64(v)
		// A state whose rules this build does not know would be applied
		// by the rules it knows, unlike the servers that raised them.
		if rules := u64(tx.Bucket(bucketMeta).Get(metaRules)); rules > EntryFormat {
			return errcode.InvalidSnapshot.With("the state follows the rules of entry format %d; this build applies up to %d: upgrade this node", rules, EntryFormat)
		}
		// The records Apply decodes must decode: a bad one would stop
		// every node that installed the file.
		for _, rec := range recordChecks {
			b := tx.Bucket(rec.bucket)
			if b == nil {
				continue
			}
			err := b.ForEach(func(k, v []byte) error {
				if rec.decode(k, v) != nil {
					return errcode.InvalidSnapshot.With("%s record %q is malformed", rec.bucket, k)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if err := staging.Check(tx); err != nil {
			return errcode.InvalidSnapshot.With("%v", err)
		}
		if contents {
			if err := checkContents(tx); err != nil {
				return err
			}
		}
		// Reading every key and value touches every page: a truncated
		// or damaged file fails here rather than in Apply.
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) })
	})
	return applied, err
}

// StateBackend returns the island's backend hash recorded in the state
// file at path ("" when none is) and the file's applied index. It opens the
// file read-only, as a raftlockd state file that raft or another process
// may hold (a snapshot's data). Anything that is not a readable state file
// is errcode.InvalidSnapshot.
func StateBackend(path string) (backend string, applied uint64, err error) {
	err = viewStateFile(path, func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return errcode.InvalidSnapshot.With("not a raftlockd state file: no %q bucket", bucketMeta)
		}
		backend, applied = string(meta.Get(metaBackend)), u64(meta.Get(metaApplied))
		return nil
	})
	return backend, applied, err
}

// recordChecks decodes the records of every bucket whose values Apply
// decodes.
var recordChecks = []struct {
	bucket []byte
	decode func(k, v []byte) error
}{
	{bucketKeys, jsonOf[KeyRecord]},
	{bucketWaiters, jsonOf[Waiter]},
	{bucketTxns, jsonOf[TxnRecord]},
	{bucketQMsgs, jsonOf[Message]},
	{bucketQWaiters, jsonOf[QueueWaiter]},
	{bucketQEnded, jsonOf[deliveryEnd]},
	{bucketQIdem, jsonOf[idemRecord]},
	{bucketRMs, jsonOf[RMEntry]},
	{bucketRevoked, jsonOf[Revocation]},
	{bucketTrust, jsonOf[TrustedCA]},
	{bucketUTXOHolds, jsonOf[utxoHold]},
	{bucketUTXOBlocks, jsonOf[BlockInfo]},
	{bucketUTXOOuts, func(_, v []byte) error { return decodeOut(v, &utxoOutput{}) }},
	{bucketUTXORecs, func(k, v []byte) error {
		if bytes.HasSuffix(k, u32Key(utxoLockIndex)) {
			return jsonOf[UTXOLock](k, v)
		}
		return decodeRecord(v, &UTXORecord{})
	}},
}

// checkContents matches what clients read back against the records that
// describe it: every committed document against its key's ETag and size,
// every message payload against its size. Damage there would otherwise be
// served as it is.
func checkContents(tx *bolt.Tx) error {
	docs, bodies := tx.Bucket(bucketDocs), tx.Bucket(bucketQBodies)
	present := 0
	err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
		var rec KeyRecord
		_ = json.Unmarshal(v, &rec) // recordChecks decoded it
		doc := docs.Get(k)
		if !rec.State {
			if doc != nil {
				return errcode.InvalidSnapshot.With("key %q has a document but its record says none", k)
			}
			return nil
		}
		present++
		if int64(len(doc)) != rec.Size || !staging.DocMatches(doc, rec.ETag) {
			return errcode.InvalidSnapshot.With("the document of key %q does not match its record's size and etag", k)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n := docs.Stats().KeyN; n != present {
		return errcode.InvalidSnapshot.With("%d documents, but %d key records with one", n, present)
	}
	if err := staging.CheckDocuments(tx); err != nil {
		return errcode.InvalidSnapshot.With("%v", err)
	}
	if err := checkCounts(tx); err != nil {
		return err
	}
	if tx.Bucket(bucketQMsgs) == nil || bodies == nil {
		return nil
	}
	messages := 0
	err = tx.Bucket(bucketQMsgs).ForEach(func(k, v []byte) error {
		var m Message
		_ = json.Unmarshal(v, &m)
		messages++
		if int64(len(bodies.Get(k))) != m.Bytes {
			return errcode.InvalidSnapshot.With("the payload of message %q does not match its size", k)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n := bodies.Stats().KeyN; n > messages {
		return errcode.InvalidSnapshot.With("%d message payloads, but %d messages", n, messages)
	}
	return nil
}

func jsonOf[T any](_, v []byte) error {
	var t T
	return json.Unmarshal(v, &t)
}

func walk(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nested := b.Bucket(k); nested != nil {
				return walk(nested)
			}
		}
		return nil
	})
}

// PrepareRestore readies the state file at path, already checked with
// CheckStateFile, to replace this state machine's state without moving back
// what must only move forward: every key's fencing counter is raised to at
// least its current value (a key the file does not know gets a record that
// holds only its counter), so is every message's the file holds, the
// replicated clock, the coordinators' terms, the island's voter high-water
// mark and the rules it follows to at least the current ones, the latest
// time the island may have forgotten a transaction (metaTxnForgot) to at
// least the current clock, the file's
// denylist gets the current one's serials, its trust list loses the CAs
// removed from the current one, and the island keeps its backend hash and
// its own registry entry. Documents, versions, leases, queues and
// transactions are the file's. The caller must keep commands from being
// applied between this call and the restore.
func (f *FSM) PrepareRestore(path string) error {
	return guard(func() error {
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			return errcode.InvalidSnapshot.With("not a raftlockd state file: %v", err)
		}
		defer db.Close()
		return f.View(func(cur *View) error {
			return db.Update(func(tx *bolt.Tx) error {
				// A key the file does not know gets a record holding only
				// its counter; a message it does not know stays gone.
				if err := raiseKeyTokens(cur, tx); err != nil {
					return err
				}
				if err := raiseMessageTokens(cur, tx); err != nil {
					return err
				}
				// Coordinators' terms only rise: a decision of a deposed
				// coordinator stays refused.
				terms, err := tx.CreateBucketIfNotExists(bucketTCTerms)
				if err != nil {
					return err
				}
				err = cur.b(bucketTCTerms).ForEach(func(home, v []byte) error {
					if u64(v) <= u64(terms.Get(home)) {
						return nil
					}
					return terms.Put(bytes.Clone(home), bytes.Clone(v))
				})
				if err != nil {
					return err
				}
				// A revoked certificate stays revoked: the file gets the
				// current denylist's entries it lacks.
				revoked, err := tx.CreateBucketIfNotExists(bucketRevoked)
				if err != nil {
					return err
				}
				err = cur.b(bucketRevoked).ForEach(func(serial, v []byte) error {
					if revoked.Get(serial) != nil {
						return nil
					}
					return revoked.Put(bytes.Clone(serial), bytes.Clone(v))
				})
				if err != nil {
					return err
				}
				if err := keepDistrust(cur, tx); err != nil {
					return err
				}
				meta := tx.Bucket(bucketMeta)
				if clock := u64(cur.b(bucketMeta).Get(metaNow)); clock > u64(meta.Get(metaNow)) {
					if err := meta.Put(metaNow, putU64(clock)); err != nil {
						return err
					}
				}
				// The island forgets every transaction the file does not
				// hold: one it has no record of afterwards may be one it
				// knew until now.
				forgot := max(u64(cur.b(bucketMeta).Get(metaTxnForgot)), u64(cur.b(bucketMeta).Get(metaNow)))
				if forgot > u64(meta.Get(metaTxnForgot)) {
					if err := meta.Put(metaTxnForgot, putU64(forgot)); err != nil {
						return err
					}
				}
				// The island's voter high-water mark only rises too, and so
				// do the rules it follows.
				for _, k := range [][]byte{metaVoters, metaRules} {
					if v := u64(cur.b(bucketMeta).Get(k)); v > u64(meta.Get(k)) {
						if err := meta.Put(k, putU64(v)); err != nil {
							return err
						}
					}
				}
				if backend := cur.b(bucketMeta).Get(metaBackend); len(backend) > 0 {
					if err := keepOwnEntry(cur, tx, bytes.Clone(meta.Get(metaBackend)), backend); err != nil {
						return err
					}
					return meta.Put(metaBackend, bytes.Clone(backend))
				}
				return nil
			})
		})
	})
}

// keepDistrust leaves out of the file's trust list every CA removed from
// the current one (an island's CA may have been removed because it was
// compromised), and keeps the removals for later restores.
func keepDistrust(cur *View, tx *bolt.Tx) error {
	trust, err := tx.CreateBucketIfNotExists(bucketTrust)
	if err != nil {
		return err
	}
	distrust, err := tx.CreateBucketIfNotExists(bucketDistrust)
	if err != nil {
		return err
	}
	return cur.b(bucketDistrust).ForEach(func(fp, v []byte) error {
		if err := trust.Delete(fp); err != nil {
			return err
		}
		if distrust.Get(fp) != nil {
			return nil
		}
		return distrust.Put(bytes.Clone(fp), bytes.Clone(v))
	})
}

// raiseMessageTokens raises the counter of every message in the file to the
// highest token any message has been delivered with: a message the file
// holds may have been delivered again since the backup, then acknowledged
// and removed, leaving no record of its own to raise it to. A state that
// predates that record counts its messages' own counters.
func raiseMessageTokens(cur *View, tx *bolt.Tx) error {
	hwm := u64(cur.b(bucketMeta).Get(metaMsgTokens))
	err := cur.b(bucketQMsgs).ForEach(func(k, v []byte) error {
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("fsm: current %s record %q: %w", bucketQMsgs, k, err)
		}
		hwm = max(hwm, uint64(m.Fencing))
		return nil
	})
	if err != nil || hwm == 0 {
		return err
	}
	return raiseFencing(tx, bucketQMsgs, metaMsgTokens, hwm, func(m *Message) *int64 { return &m.Fencing })
}

// keepOwnEntry gives the registry entries of the island the file came from
// (from) and of this island (self) their current values: restored into
// another island, the file's own entry would name the island it came from
// as a peer, and this island would register itself there.
func keepOwnEntry(cur *View, tx *bolt.Tx, from, self []byte) error {
	into, err := tx.CreateBucketIfNotExists(bucketRMs)
	if err != nil {
		return err
	}
	for _, backend := range [][]byte{from, self} {
		if len(backend) == 0 {
			continue
		}
		if v := cur.b(bucketRMs).Get(backend); v != nil {
			err = into.Put(bytes.Clone(backend), bytes.Clone(v))
		} else {
			err = into.Delete(backend)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// raiseKeyTokens raises the fencing counter of every key in the file to at
// least its current value, so that no token repeats; a key the file does
// not know gets a record holding only the counter. A key forgotten since
// the file was made counted at most to the current floor, so every key of
// the file counts on from at least the floor, and the file's floor rises
// to it.
func raiseKeyTokens(cur *View, tx *bolt.Tx) error {
	into, err := tx.CreateBucketIfNotExists(bucketKeys)
	if err != nil {
		return err
	}
	if floor := cur.keyFloor(); floor > 0 {
		if err := raiseFencing(tx, bucketKeys, metaKeyTokens, uint64(floor), func(r *KeyRecord) *int64 { return &r.Fencing }); err != nil {
			return err
		}
	}
	return cur.b(bucketKeys).ForEach(func(k, v []byte) error {
		var now, rec KeyRecord
		if err := json.Unmarshal(v, &now); err != nil {
			return fmt.Errorf("fsm: current %s record %q: %w", bucketKeys, k, err)
		}
		if old := into.Get(k); old != nil {
			if err := json.Unmarshal(old, &rec); err != nil {
				return errcode.InvalidSnapshot.With("%s record %q is malformed", bucketKeys, k)
			}
			if rec.Fencing >= now.Fencing {
				return nil
			}
		}
		rec.Fencing = now.Fencing
		raw, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return into.Put(bytes.Clone(k), raw)
	})
}

// raiseFencing raises the fencing counter of every record of bucket in the
// file tx that is below floor to it, and the file's counter metaKey to at
// least floor.
func raiseFencing[T any](tx *bolt.Tx, bucket, metaKey []byte, floor uint64, fencing func(*T) *int64) error {
	records, err := tx.CreateBucketIfNotExists(bucket)
	if err != nil {
		return err
	}
	raised := map[string][]byte{} // written after the walk: bbolt forbids writes during it
	err = records.ForEach(func(k, v []byte) error {
		var rec T
		if err := json.Unmarshal(v, &rec); err != nil {
			return errcode.InvalidSnapshot.With("%s record %q is malformed", bucket, k)
		}
		f := fencing(&rec)
		if uint64(*f) >= floor {
			return nil
		}
		*f = int64(floor)
		raw, err := json.Marshal(rec)
		raised[string(k)] = raw
		return err
	})
	if err != nil {
		return err
	}
	for k, raw := range raised {
		if err := records.Put([]byte(k), raw); err != nil {
			return err
		}
	}
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	if floor > u64(meta.Get(metaKey)) {
		return meta.Put(metaKey, putU64(floor))
	}
	return nil
}
