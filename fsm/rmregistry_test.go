package fsm

import (
	"maps"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

const retentionMs = int64(RMRemovalRetention / 1e6)

func passedOn(endpoint string, remove bool, at int64) RMRegisterCmd {
	return RMRegisterCmd{Backend: "b", Endpoint: endpoint, Remove: remove, PassedOn: true, ChangedAt: at}
}

func present(at int64) RMEntry {
	return RMEntry{Endpoints: []string{"e"}, UpdatedAt: 1, Added: map[string]int64{"e": at}}
}

func removed(at int64) RMEntry {
	return RMEntry{Endpoints: []string{}, UpdatedAt: 1, Removed: map[string]int64{"e": at}}
}

// The registry's rule: the newest change of an endpoint wins, a removal
// wins a tie, a change made here always wins here, and a change the entry
// shows already changes nothing.
func TestRMEntryApplyIsLastWriterWins(t *testing.T) {
	const now = 10_000_000_000
	const T = now - 1_000_000                              // within the retention
	old := RMEntry{Endpoints: []string{"e"}, UpdatedAt: 1} // a record from before times were kept
	for _, tc := range []struct {
		name     string
		entry    RMEntry
		change   RMRegisterCmd
		changed  bool
		present  bool  // e is an endpoint afterwards
		at       int64 // the time recorded for e afterwards
		recorded bool  // e has a record afterwards
	}{
		{"an introduction of an unknown endpoint", RMEntry{}, passedOn("e", false, T+50), true, true, T + 50, true},
		{"an introduction without a time", RMEntry{}, passedOn("e", false, 0), true, true, 0, true},
		{"an older introduction", present(T + 100), passedOn("e", false, T+50), false, true, T + 100, true},
		{"the same introduction", present(T + 100), passedOn("e", false, T+100), false, true, T + 100, true},
		{"a newer introduction", present(T + 100), passedOn("e", false, T+150), true, true, T + 150, true},
		{"a removal at the same time", present(T + 100), passedOn("e", true, T+100), true, false, T + 100, true},
		{"an older removal", present(T + 100), passedOn("e", true, T+99), false, true, T + 100, true},
		{"a newer removal", present(T + 100), passedOn("e", true, T+200), true, false, T + 200, true},
		{"an introduction older than the removal", removed(T + 200), passedOn("e", false, T+150), false, false, T + 200, true},
		{"an introduction as old as the removal", removed(T + 200), passedOn("e", false, T+200), false, false, T + 200, true},
		{"an introduction newer than the removal", removed(T + 200), passedOn("e", false, T+201), true, true, T + 201, true},
		{"the same removal", removed(T + 200), passedOn("e", true, T+200), false, false, T + 200, true},
		{"a newer removal of a removed endpoint", removed(T + 200), passedOn("e", true, T+300), true, false, T + 300, true},
		{"a removal of an unknown endpoint", RMEntry{}, passedOn("e", true, now-5), true, false, now - 5, true},
		{"a removal older than the retention, unknown", RMEntry{}, passedOn("e", true, 5), false, false, 0, false},
		{"a removal older than the retention, registered before", present(1), passedOn("e", true, 5), true, false, 0, false},
		{"a removal of an endpoint recorded without a time", old, passedOn("e", true, now-5), true, false, now - 5, true},
		{"an introduction of an endpoint recorded without a time", old, passedOn("e", false, 0), false, true, 0, true},
		{"a registration here", RMEntry{}, RMRegisterCmd{Backend: "b", Endpoint: "e"}, true, true, now, true},
		{"a registration here, of a present endpoint", present(T + 100), RMRegisterCmd{Backend: "b", Endpoint: "e"}, false, true, T + 100, true},
		{"a registration here after a removal stamped ahead", removed(now + 500), RMRegisterCmd{Backend: "b", Endpoint: "e"}, true, true, now + 501, true},
		{"a removal here", present(T + 100), RMRegisterCmd{Backend: "b", Endpoint: "e", Remove: true}, true, false, now, true},
		{"a removal here, of a removed endpoint", removed(T + 100), RMRegisterCmd{Backend: "b", Endpoint: "e", Remove: true}, false, false, T + 100, true},
		{"a removal here, of an unknown endpoint", RMEntry{}, RMRegisterCmd{Backend: "b", Endpoint: "e", Remove: true}, true, false, now, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := RMEntry{Endpoints: slices.Clone(tc.entry.Endpoints), UpdatedAt: tc.entry.UpdatedAt,
				Added: maps.Clone(tc.entry.Added), Removed: maps.Clone(tc.entry.Removed)}
			next, changed := tc.entry.Apply(tc.change, now)
			if changed != tc.changed {
				t.Fatalf("changed = %v, want %v (%+v)", changed, tc.changed, next)
			}
			at, gone, known := next.ChangedAt("e")
			if slices.Contains(next.Endpoints, "e") != tc.present || gone == tc.present && known || at != tc.at || known != tc.recorded {
				t.Fatalf("after the change: %+v; want present %v at %d (recorded %v)", next, tc.present, tc.at, tc.recorded)
			}
			if presenceChanged := slices.Contains(before.Endpoints, "e") != tc.present; presenceChanged != (next.UpdatedAt == now) {
				t.Fatalf("updated_at %d after a change that moved the endpoints: %v", next.UpdatedAt, presenceChanged)
			}
			if !changed && !entriesEqual(next, before) {
				t.Fatalf("an ignored change returned %+v, want the entry unchanged", next)
			}
			if !entriesEqual(tc.entry, before) {
				t.Fatalf("Apply changed the entry it was called on: %+v", tc.entry)
			}
			if again, changed := next.Apply(tc.change, now); changed && tc.change.PassedOn {
				t.Fatalf("the same change passed on again changed the entry: %+v", again)
			}
		})
	}
}

func entriesEqual(a, b RMEntry) bool {
	return slices.Equal(a.Endpoints, b.Endpoints) && a.UpdatedAt == b.UpdatedAt &&
		maps.Equal(a.Added, b.Added) && maps.Equal(a.Removed, b.Removed)
}

// Removal records older than the retention are dropped when the entry
// changes, not before.
func TestRMEntryDropsRemovalRecordsPastTheRetention(t *testing.T) {
	e := RMEntry{Endpoints: []string{}, Removed: map[string]int64{"old": 1_000, "new": 1_000 + retentionMs}}
	now := 1_000 + retentionMs + 1
	if _, changed := e.Apply(passedOn("new", true, 1_000), now); changed {
		t.Fatal("an older removal changed the entry")
	}
	next, changed := e.Apply(passedOn("x", false, now), now)
	if !changed || !maps.Equal(next.Removed, map[string]int64{"new": 1_000 + retentionMs}) {
		t.Fatalf("after a change at %d: %+v %v; want only the removal record within the retention", now, next, changed)
	}
}

func rmRegister(h *harness, now int64, c RMRegisterCmd) *RMInfo {
	h.t.Helper()
	res := h.one(&Command{Op: OpRMRegister, Now: now, RMRegister: &c})
	if res.Err != nil || res.RM == nil {
		h.t.Fatalf("register %+v: %+v", c, res)
	}
	return res.RM
}

func registry(h *harness) (listed, all map[string]RMEntry, updated int64) {
	_ = h.f.View(func(v *View) error {
		listed, all, updated = v.RMs(), v.RMRecords(), v.RMsUpdatedAt()
		return nil
	})
	return listed, all, updated
}

// Through the state machine: an operator's registration takes the
// command's time, a removal of an island's last endpoint leaves a removal
// record while the island leaves the list, and an introduction older than
// the removal (an island that missed it) changes nothing until the record
// is past the retention.
func TestRMRegisterKeepsRemovalRecords(t *testing.T) {
	h := openHarness(t, t.TempDir())
	const t0 = 2_000_000
	if info := rmRegister(h, t0, RMRegisterCmd{Backend: "b", Endpoint: "e"}); !info.Changed || info.Entry.Added["e"] != t0 {
		t.Fatalf("registration: %+v", info)
	}
	if info := rmRegister(h, t0+100, RMRegisterCmd{Backend: "b", Endpoint: "e", Remove: true}); !info.Changed ||
		len(info.Entry.Endpoints) != 0 || info.Entry.UpdatedAt != t0+100 {
		t.Fatalf("removal: %+v", info)
	}
	listed, all, updated := registry(h)
	if _, ok := listed["b"]; ok || all["b"].Removed["e"] != t0+100 || updated != t0+100 {
		t.Fatalf("after the removal of the last endpoint: listed %v, records %v, updated at %d", listed, all, updated)
	}
	// The island that missed the removal introduces the endpoint again.
	if info := rmRegister(h, t0+200, passedOn("e", false, t0)); info.Changed {
		t.Fatalf("a stale introduction changed the registry: %+v", info)
	}
	// An older change passed on again, and the removal itself, neither.
	if info := rmRegister(h, t0+300, passedOn("e", true, t0+100)); info.Changed {
		t.Fatalf("the same removal passed on again changed the registry: %+v", info)
	}
	if listed, _, updated := registry(h); len(listed) != 0 || updated != t0+100 {
		t.Fatalf("after the stale changes: %v, updated at %d", listed, updated)
	}
	// Once the record is past the retention, the entry's next change drops
	// it, and the stale introduction is taken.
	late := t0 + 100 + retentionMs + 1
	rmRegister(h, late, RMRegisterCmd{Backend: "b", Endpoint: "f"})
	if _, all, _ := registry(h); len(all["b"].Removed) != 0 {
		t.Fatalf("a removal record past the retention was kept: %+v", all["b"])
	}
	if info := rmRegister(h, late+1, passedOn("e", false, t0)); !info.Changed || !slices.Contains(info.Entry.Endpoints, "e") {
		t.Fatalf("an introduction after the removal was forgotten: %+v", info)
	}
}

// A registry record written before times were kept decodes, passes the
// backup checks, is listed, and takes a removal passed on with any time.
func TestRMRecordWithoutTimesStillWorks(t *testing.T) {
	h := openHarness(t, t.TempDir())
	err := h.f.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRMs).Put([]byte("b"), []byte(`{"endpoints":["http://e"],"updated_at":5}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckStateFile(snapshotFile(t, h)); err != nil {
		t.Fatalf("a state with an old registry record: %v", err)
	}
	if listed, _, _ := registry(h); !slices.Equal(listed["b"].Endpoints, []string{"http://e"}) {
		t.Fatalf("the old record is listed as %+v", listed)
	}
	if info := rmRegister(h, 2_000_000, RMRegisterCmd{Backend: "b", Endpoint: "http://e", PassedOn: true}); info.Changed {
		t.Fatalf("an introduction without a time changed an old record: %+v", info)
	}
	if info := rmRegister(h, 2_000_000, RMRegisterCmd{Backend: "b", Endpoint: "http://e", Remove: true, PassedOn: true,
		ChangedAt: 1_999_000}); !info.Changed || len(info.Entry.Endpoints) != 0 {
		t.Fatalf("a removal of an endpoint of an old record: %+v", info)
	}
}

// A restore keeps the island's own entry with its removal records, and
// takes the backup's other entries with theirs, those that hold nothing
// but removal records included.
func TestPrepareRestoreKeepsRemovalRecords(t *testing.T) {
	src := openHarness(t, t.TempDir())
	src.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-a"}})
	rmRegister(src, 2_000_000, RMRegisterCmd{Backend: "island-b", Endpoint: "https://b0:9341"})
	rmRegister(src, 2_000_000, RMRegisterCmd{Backend: "island-d", Endpoint: "https://d1:9341"})
	rmRegister(src, 2_000_100, RMRegisterCmd{Backend: "island-d", Endpoint: "https://d1:9341", Remove: true})
	backup := snapshotFile(t, src)

	dst := openHarness(t, t.TempDir())
	dst.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-b"}})
	rmRegister(dst, 2_000_000, RMRegisterCmd{Backend: "island-b", Endpoint: "https://b1:9341"})
	rmRegister(dst, 2_000_200, RMRegisterCmd{Backend: "island-b", Endpoint: "https://b0:9341", Remove: true})
	restoreBackup(t, dst, backup)
	listed, all, _ := registry(dst)
	if own := all["island-b"]; !slices.Equal(own.Endpoints, []string{"https://b1:9341"}) || own.Removed["https://b0:9341"] != 2_000_200 {
		t.Errorf("the restoring island's own entry is %+v, want its current one", own)
	}
	if _, ok := listed["island-d"]; ok || all["island-d"].Removed["https://d1:9341"] != 2_000_100 {
		t.Errorf("the backup's removal-only entry after the restore: listed %v, records %+v", listed, all["island-d"])
	}
}
