package lincheck

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

const ms = int64(time.Millisecond)

var ttl = int64(3 * time.Second)

// hist builds histories by hand: times are in milliseconds and a lease's
// expiry window follows from the acquire that granted it.
type hist struct {
	ops    []Op
	leases map[string][2]int64 // name -> acquire call, return
}

func (h *hist) add(client int, in Input, out Output, call, ret int64) {
	in.Call, in.Return = call*ms, ret*ms
	if in.Lease != "" {
		w := h.leases[in.Lease]
		in.LeaseMinExp, in.LeaseMaxExp = w[0]+ttl-Slack, w[1]+ttl+Slack
	}
	if in.Kind == KindAcquire {
		in.TTL = ttl
		if out.Status == StatusOK {
			if h.leases == nil {
				h.leases = map[string][2]int64{}
			}
			h.leases[out.Lease] = [2]int64{in.Call, in.Return}
		}
	}
	h.ops = append(h.ops, Op{Client: client, Input: in, Output: out})
}

func (h *hist) acquire(client int, lease string, token, version, call, ret int64) {
	h.add(client, Input{Kind: KindAcquire, Key: "k"}, Output{Status: StatusOK, Lease: lease, Token: token, Version: version}, call, ret)
}

func (h *hist) update(client int, lease, value string, out Output, call, ret int64) {
	h.add(client, Input{Kind: KindUpdate, Key: "k", Lease: lease, Value: value}, out, call, ret)
}

func (h *hist) get(client int, lease string, out Output, call, ret int64) {
	kind := KindLeaseGet
	if lease == "" {
		kind = KindPublicGet
	}
	h.add(client, Input{Kind: kind, Key: "k", Lease: lease}, out, call, ret)
}

func (h *hist) release(client int, lease string, rollback bool, out Output, call, ret int64) {
	h.add(client, Input{Kind: KindRelease, Key: "k", Lease: lease, Rollback: rollback}, out, call, ret)
}

// keepalive extends lease by ttl.
func (h *hist) keepalive(client int, lease string, out Output, call, ret int64) {
	h.add(client, Input{Kind: KindKeepAlive, Key: "k", Lease: lease, TTL: ttl}, out, call, ret)
}

// write is an update (value set) or removal (value "") by lease, under
// conditions: version >= 0 asks for that version, etag != "-" for that
// ETag ("" for no document).
func (h *hist) write(client int, lease, value string, version int64, etag string, out Output, call, ret int64) {
	in := Input{Kind: KindUpdate, Key: "k", Lease: lease, Value: value}
	if value == "" {
		in.Kind = KindRemove
	}
	if version >= 0 {
		in.HasIfVersion, in.IfVersion = true, version
	}
	if etag != "-" {
		in.HasIfETag, in.IfETag = true, etag
	}
	h.add(client, in, out, call, ret)
}

// conflict is a refusal by a condition, naming the holder's view.
func conflict(code string, version int64, doc string) Output {
	return Output{Status: StatusFail, Code: code, CurrentVersion: version, CurrentETag: ETag(doc)}
}

func removed(was bool, version int64) Output {
	return Output{Status: StatusOK, Removed: was, Version: version}
}

// staged is the start of several broken histories: client 0 acquires L1
// (token 1) by 10ms and stages "x" (version 1) by 30ms.
func (h *hist) staged() {
	h.acquire(0, "L1", 1, 0, 0, 10)
	h.update(0, "L1", "x", Output{Status: StatusOK, Version: 1}, 20, 30)
}

// handOver has L1 (token first) committed and released by 30ms and L2
// (token second) granted at 100-110ms.
func (h *hist) handOver(first, second int64) {
	h.acquire(0, "L1", first, 0, 0, 10)
	h.release(0, "L1", false, ok, 20, 30)
	h.acquire(1, "L2", second, 0, 100, 110)
}

var (
	ok      = Output{Status: StatusOK}
	unknown = Output{Status: StatusUnknown, Code: "timeout"}
	none    = Output{Status: StatusOK, Version: 0}
)

func docOut(v string, version int64) Output {
	return Output{Status: StatusOK, Exists: true, Value: v, Version: version}
}

func fail(code string) Output { return Output{Status: StatusFail, Code: code} }

func verdict(t *testing.T, h *hist) (porcupine.CheckResult, []string) {
	t.Helper()
	history, _ := Porcupine(h.ops)
	res := porcupine.CheckOperationsTimeout(Model(), history, 10*time.Second)
	return res, append(CheckTokens(h.ops), CheckExclusive(h.ops)...)
}

// validHistory exercises every rule the model allows: staging, read your
// writes, commit, takeover of an expired lease, rollback answered from the
// record, ambiguous writes and releases, token gaps.
func validHistory() *hist {
	h := &hist{}
	h.acquire(0, "L1", 1, 0, 0, 10)
	h.update(0, "L1", "a", Output{Status: StatusOK, Version: 1}, 20, 30)
	h.get(1, "", none, 25, 35)
	h.get(0, "L1", docOut("a", 1), 40, 50)
	h.release(0, "L1", false, ok, 60, 70)
	h.get(1, "", docOut("a", 1), 80, 90)
	h.acquire(1, "L2", 2, 1, 100, 110)
	h.update(1, "L2", "b", unknown, 120, 2000)
	h.acquire(2, "L3", 3, 1, 3200, 3300) // L2 expired
	h.update(1, "L2", "c", fail("lease_expired"), 3400, 3410)
	h.release(2, "L3", true, ok, 3500, 3510)
	h.release(1, "L2", true, ok, 3600, 3610) // the expiry's rollback, answered from the record
	h.get(0, "", docOut("a", 1), 3700, 3710)
	h.acquire(0, "L4", 5, 1, 3800, 3810) // token 4 went to an acquire nobody saw
	h.update(0, "L4", "d", Output{Status: StatusOK, Version: 2}, 3820, 3830)
	h.release(0, "L4", false, unknown, 3900, 3950)
	h.get(1, "", docOut("d", 2), 4000, 4010) // the ambiguous commit happened
	h.acquire(2, "L5", 6, 2, 4020, 4030)
	h.update(2, "L5", "e", unknown, 4040, 4050)
	h.get(2, "L5", docOut("d", 2), 4060, 4070) // the ambiguous write has not (yet) happened
	h.release(2, "L5", true, ok, 4080, 4090)
	h.get(1, "", docOut("d", 2), 4100, 4110)
	// Conditional writes compare with the holder's view, staged write
	// included; a keepalive carries the lease past its first expiry.
	h.acquire(0, "L6", 7, 2, 4200, 4210)
	h.write(0, "L6", "f", 2, ETag("d"), Output{Status: StatusOK, Version: 3}, 4220, 4230)
	h.write(0, "L6", "g", 2, "-", conflict("version_conflict", 3, "f"), 4240, 4250)
	h.write(0, "L6", "g", 3, ETag("d"), conflict("etag_mismatch", 3, "f"), 4260, 4270)
	h.keepalive(0, "L6", ok, 6000, 6010)
	h.write(0, "L6", "", -1, ETag("f"), removed(true, 3), 7500, 7510) // L6 alive past 7260
	h.write(0, "L6", "", -1, "-", removed(false, 3), 7520, 7530)
	h.get(0, "L6", Output{Status: StatusOK, Version: 3}, 7540, 7550)
	h.get(1, "", docOut("d", 2), 7560, 7570)
	h.acquire(1, "L7", 8, 2, 7600, 9100) // L6 expired, its removal rolled back
	h.keepalive(0, "L6", fail("lease_expired"), 9200, 9210)
	h.write(1, "L7", "", 2, "-", removed(true, 3), 9220, 9230)
	h.release(1, "L7", false, ok, 9240, 9250)
	h.get(2, "", Output{Status: StatusOK, Version: 3}, 9260, 9270)
	h.acquire(2, "L8", 9, 3, 9300, 9310)
	h.write(2, "L8", "h", 3, "", Output{Status: StatusOK, Version: 4}, 9320, 9330) // "": no document
	h.keepalive(2, "L8", unknown, 11000, 12000)
	h.get(2, "L8", docOut("h", 4), 13000, 13010) // the ambiguous keepalive took effect
	h.release(2, "L8", false, ok, 13020, 13030)
	h.get(1, "", docOut("h", 4), 13040, 13050)
	return h
}

func TestModelAcceptsValidHistory(t *testing.T) {
	res, violations := verdict(t, validHistory())
	if res != porcupine.Ok || len(violations) > 0 {
		t.Fatalf("valid history rejected: %s %v", res, violations)
	}
}

func TestModelRejectsBrokenHistories(t *testing.T) {
	cases := map[string]struct {
		build     func(h *hist)
		violation string // expected from the checks outside porcupine, if any
	}{
		"stale write accepted after takeover": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 500)
			h.acquire(1, "L2", 2, 0, 2960, 3000) // L1 may have expired by then
			h.update(0, "L1", "x", Output{Status: StatusOK, Version: 1}, 3010, 3020)
		}, "succeeded"},
		"public read of a value never committed": {func(h *hist) {
			h.staged()
			h.release(0, "L1", true, ok, 40, 50)
			h.get(1, "", docOut("x", 1), 60, 70)
		}, ""},
		"staged value visible to a public read": {func(h *hist) {
			h.staged()
			h.get(1, "", docOut("x", 1), 40, 50)
		}, ""},
		"acknowledged commit lost": {func(h *hist) {
			h.staged()
			h.release(0, "L1", false, ok, 40, 50)
			h.get(1, "", none, 60, 70)
		}, ""},
		"key granted while its lease was live": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.acquire(1, "L2", 2, 0, 100, 110)
		}, "while L1"},
		"fencing token went backwards": {func(h *hist) { h.handOver(5, 3) }, "token order"},
		"fresh lease reported expired": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.update(0, "L1", "x", fail("lease_expired"), 20, 30)
		}, ""},
		"expired lease still writes": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.update(0, "L1", "x", Output{Status: StatusOK, Version: 1}, 3200, 3210)
		}, ""},
		"holder reads someone else's write": {func(h *hist) {
			h.staged()
			h.get(0, "L1", docOut("y", 1), 40, 50)
		}, ""},
		"fencing token repeated": {func(h *hist) { h.handOver(1, 1) }, "token order"},
		"acquire reports a version never committed": {func(h *hist) {
			h.staged()
			h.release(0, "L1", true, ok, 40, 50)
			h.acquire(1, "L2", 2, 1, 100, 110)
		}, ""},
		"commit acknowledged after the lease expired": {func(h *hist) {
			h.staged()
			h.release(0, "L1", false, ok, 3200, 3210)
		}, ""},
		"rollback of another's live lease acknowledged": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.release(0, "L1", false, ok, 20, 30)
			h.acquire(1, "L2", 2, 0, 40, 50)
			h.release(0, "L1", true, ok, 60, 70)
		}, ""},
		"holder reads its write at the wrong version": {func(h *hist) {
			h.staged()
			h.get(0, "L1", docOut("x", 2), 40, 50)
		}, ""},
		"fencing mismatch for the holder's own token": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.update(0, "L1", "x", fail("fencing_mismatch"), 20, 30)
		}, ""},
		"key granted before the expiry a keepalive set": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.keepalive(0, "L1", ok, 2000, 2010)
			h.acquire(1, "L2", 2, 0, 3200, 3300)
		}, "while L1"},
		"kept-alive lease reported expired": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.keepalive(0, "L1", ok, 2000, 2010)
			h.update(0, "L1", "x", fail("lease_expired"), 3500, 3510)
		}, ""},
		"keepalive acknowledged after the expiry": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.keepalive(0, "L1", ok, 3200, 3210)
		}, ""},
		"ambiguous keepalive after the expiry revives the lease": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.keepalive(0, "L1", unknown, 3200, 3300)
			h.update(0, "L1", "x", Output{Status: StatusOK, Version: 1}, 3400, 3410)
		}, ""},
		"write against another version accepted": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.write(0, "L1", "x", 5, "-", Output{Status: StatusOK, Version: 1}, 20, 30)
		}, ""},
		"write against another ETag accepted": {func(h *hist) {
			h.staged()
			h.write(0, "L1", "y", -1, ETag("z"), Output{Status: StatusOK, Version: 1}, 40, 50)
		}, ""},
		"write whose condition held refused": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.write(0, "L1", "x", 0, "", conflict("version_conflict", 0, ""), 20, 30)
		}, ""},
		"condition compared with the committed state, not the staged one": {func(h *hist) {
			h.staged()
			h.write(0, "L1", "y", 0, "-", Output{Status: StatusOK, Version: 1}, 40, 50)
		}, ""},
		"refusal naming a view the holder does not have": {func(h *hist) {
			h.staged()
			h.write(0, "L1", "y", 0, "-", conflict("version_conflict", 0, ""), 40, 50)
		}, ""},
		"removal not staged": {func(h *hist) {
			h.staged()
			h.write(0, "L1", "", -1, "-", removed(true, 1), 40, 50)
			h.get(0, "L1", docOut("x", 1), 60, 70)
		}, ""},
		"committed removal still visible": {func(h *hist) {
			h.staged()
			h.release(0, "L1", false, ok, 40, 50)
			h.acquire(1, "L2", 2, 1, 60, 70)
			h.write(1, "L2", "", -1, "-", removed(true, 2), 80, 90)
			h.release(1, "L2", false, ok, 100, 110)
			h.get(0, "", docOut("x", 1), 120, 130)
		}, ""},
		"removal of no document reported done": {func(h *hist) {
			h.acquire(0, "L1", 1, 0, 0, 10)
			h.write(0, "L1", "", -1, "-", removed(true, 1), 20, 30)
		}, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := &hist{}
			c.build(h)
			res, violations := verdict(t, h)
			if res != porcupine.Illegal {
				t.Errorf("porcupine accepted the history (%s)", res)
			}
			if c.violation != "" && !strings.Contains(strings.Join(violations, "\n"), c.violation) {
				t.Errorf("checks found %q, want a finding containing %q", violations, c.violation)
			}
			if c.violation == "" && len(violations) > 0 && name != "key granted while its lease was live" {
				t.Logf("also found: %v", violations)
			}
		})
	}
}

// A failing check writes the porcupine visualization and the history.
func TestCheckWritesVisualization(t *testing.T) {
	h := validHistory()
	h.get(1, "", docOut("never", 9), 5000, 5010)
	dir := t.TempDir()
	res := Check(h.ops, []Event{{At: 100 * ms, Desc: "isolate leader n1"}}, CheckOptions{Timeout: 10 * time.Second, OutDir: dir, Name: "broken"})
	if res.OK() || !res.Failed || res.Porcupine != porcupine.Illegal {
		t.Fatalf("broken history passed: %+v", res)
	}
	for _, f := range []string{res.Visualization, res.HistoryFile} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Fatalf("missing output %q: %v", f, err)
		}
	}
	if res := Check(validHistory().ops, nil, CheckOptions{Timeout: 10 * time.Second, OutDir: dir, Name: "valid"}); !res.OK() || res.Failed || res.Visualization != "" {
		t.Fatalf("valid history: %+v", res)
	}
}

// A porcupine timeout is a failure on a small history and is saved like
// any failure; on a large one it is neither.
func TestCheckSavesTimedOutSmallHistory(t *testing.T) {
	defer func(f func(porcupine.Model, []porcupine.Operation, time.Duration) porcupine.CheckResult) {
		checkOperations = f
	}(checkOperations)
	checkOperations = func(porcupine.Model, []porcupine.Operation, time.Duration) porcupine.CheckResult {
		return porcupine.Unknown
	}
	dir := t.TempDir()
	h := validHistory()
	res := Check(h.ops, nil, CheckOptions{Timeout: time.Second, SmallHistory: 400, OutDir: dir, Name: "small"})
	if !res.Failed || res.Porcupine != porcupine.Unknown {
		t.Fatalf("timeout on a small history passed: %+v", res)
	}
	for _, f := range []string{res.Visualization, res.HistoryFile} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Fatalf("missing output %q: %v", f, err)
		}
	}
	res = Check(h.ops, nil, CheckOptions{Timeout: time.Second, SmallHistory: res.Checked - 1, OutDir: dir, Name: "large"})
	if res.Failed || res.Visualization != "" || res.HistoryFile != "" {
		t.Fatalf("timeout on a large history: %+v", res)
	}
}

func TestCombineAttempts(t *testing.T) {
	amb := attempt{status: StatusUnknown, code: "timeout"}
	unreached := attempt{status: StatusFail, code: "no_leader"}
	rejected := attempt{status: StatusFail, code: "lease_expired", decided: true}
	okay := attempt{status: StatusOK, decided: true}
	for _, c := range []struct {
		as   []attempt
		want Status
	}{
		{[]attempt{amb, okay}, StatusOK},
		{[]attempt{amb, rejected}, StatusFail},
		{[]attempt{amb, unreached}, StatusUnknown},
		{[]attempt{unreached}, StatusFail},
		{[]attempt{amb, amb, amb}, StatusUnknown},
	} {
		if got := combine(c.as); got.status != c.want {
			t.Errorf("combine(%v) = %s, want %s", c.as, got.status, c.want)
		}
	}
}
