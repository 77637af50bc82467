package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// crashSeedEnv reproduces a run of TestCrashSafety: set it to the seed the
// failing run logged.
const crashSeedEnv = "RAFTLOCKD_TEST_CRASH_SEED"

// crashDoc is the document every writer commits to its key.
type crashDoc struct {
	Writer  int   `json:"writer"`
	Counter int64 `json:"counter"`
}

// writerLog is what one writer knows: the last counter it tried to commit,
// the last one whose release was acknowledged and every fencing token it
// was handed. Only its writer goroutine touches it while writers run.
type writerLog struct {
	key           string
	lastAttempted int64
	lastAcked     int64
	maxToken      int64
	acked         int
}

// TestCrashSafety SIGKILLs a server while writers commit, restarts it on the
// same data dir and checks that no acknowledged commit was lost, that no
// value appears that was never written, and that fencing tokens keep
// growing across the crash.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	const (
		writers     = 8
		cycles      = 3                       // kill/restart cycles
		minAcks     = 2 * writers             // commits acknowledged before a kill may come
		maxKillWait = 1500 * time.Millisecond // random extra delay before the kill
	)
	seed := time.Now().UnixNano()
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", crashSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (set %s=%d to repeat the kill timing)", seed, crashSeedEnv, seed)
	rng := rand.New(rand.NewSource(seed))

	dir, listen, raftListen := t.TempDir(), testutil.FreeAddr(t), testutil.FreeAddr(t)
	args := serverFlags(dir, listen, raftListen)
	logs := make([]*writerLog, writers)
	for i := range logs {
		logs[i] = &writerLog{key: fmt.Sprintf("crash-%d", i)}
	}

	srv := startServer(t, dir, listen, args, nil)
	for cycle := 1; cycle <= cycles; cycle++ {
		delay := time.Duration(rng.Int63n(int64(maxKillWait)))
		acked := runWritersUntilKill(t, srv, logs, minAcks, delay)
		t.Logf("cycle %d: %d commits acknowledged, killed %s after the first %d", cycle, acked, delay, minAcks)
		if t.Failed() {
			return
		}
		srv = startServer(t, dir, listen, args, nil)
		verifyAfterCrash(t, srv, logs)
		if t.Failed() {
			return
		}
	}
	total := 0
	for _, l := range logs {
		total += l.acked
	}
	t.Logf("%d commits acknowledged over %d crashes", total, cycles)
}

// runWritersUntilKill runs one writer per log against srv, SIGKILLs the
// server once minAcks commits were acknowledged and delay has passed, and
// returns when every writer has stopped.
func runWritersUntilKill(t *testing.T, srv *serverProc, logs []*writerLog, minAcks int, delay time.Duration) int {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: len(logs), TLSClientConfig: srv.clientTLS()}
	defer tr.CloseIdleConnections()
	c, err := client.New(srv.url, client.WithRetry(0), client.WithHTTPClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	enough := make(chan struct{})
	var enoughOnce sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, l := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if writeOnce(t, c, w, l) {
					if acked.Add(1) >= int64(minAcks) {
						enoughOnce.Do(func() { close(enough) })
					}
				} else {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(20 * time.Second):
		t.Errorf("only %d commits acknowledged in 20s", acked.Load())
	}
	time.Sleep(delay)
	srv.kill() // SIGKILL, while writers are mid-flight
	close(stop)
	wg.Wait()
	return int(acked.Load())
}

// writeOnce is one acquire, update, commit round of writer w. It reports
// whether the commit was acknowledged; any error means it was not.
func writeOnce(t *testing.T, c *client.Client, w int, l *writerLog) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := c.Acquire(ctx, wire.AcquireRequest{Key: l.key, Owner: "crash-writer", TTLSeconds: 1, BlockSecs: 5})
	if err != nil {
		return false
	}
	if lease.FencingToken <= l.maxToken {
		t.Errorf("%s: acquire got fencing token %d after %d", l.key, lease.FencingToken, l.maxToken)
	}
	l.maxToken = max(l.maxToken, lease.FencingToken)
	l.lastAttempted++
	n := l.lastAttempted
	doc, _ := json.Marshal(crashDoc{Writer: w, Counter: n})
	if _, err := lease.Update(ctx, doc, client.Conditions{}); err != nil {
		_ = lease.Release(ctx, true) // best effort; the TTL frees the key otherwise
		return false
	}
	if err := lease.Release(ctx, false); err != nil {
		return false
	}
	l.lastAcked = n
	l.acked++
	return true
}

// verifyAfterCrash checks every writer's key on the restarted server: the
// committed counter is at least the last acknowledged one and at most the
// last attempted one, and a new acquire gets a larger fencing token than
// any handed out before.
func verifyAfterCrash(t *testing.T, srv *serverProc, logs []*writerLog) {
	t.Helper()
	c, err := client.New(srv.url, client.WithTLS(srv.clientTLS()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	read := func(w int, l *writerLog, when string) int64 {
		doc, err := c.GetPublic(ctx, "", l.key)
		if err != nil {
			t.Fatalf("%s: get %s: %v", when, l.key, err)
		}
		if !doc.Exists {
			if l.lastAcked > 0 {
				t.Errorf("%s: %s has no committed state, but counter %d was acknowledged", when, l.key, l.lastAcked)
			}
			return 0
		}
		var d crashDoc
		if err := json.Unmarshal(doc.Body, &d); err != nil {
			t.Fatalf("%s: %s holds %q: %v", when, l.key, doc.Body, err)
		}
		switch {
		case d.Writer != w:
			t.Errorf("%s: %s holds writer %d's document %s", when, l.key, d.Writer, doc.Body)
		case d.Counter < l.lastAcked:
			t.Errorf("%s: %s holds counter %d, but %d was acknowledged: an acknowledged commit was lost", when, l.key, d.Counter, l.lastAcked)
		case d.Counter > l.lastAttempted:
			t.Errorf("%s: %s holds counter %d, but only %d was ever written", when, l.key, d.Counter, l.lastAttempted)
		}
		return d.Counter
	}
	pending, landed := 0, 0
	for w, l := range logs {
		before := read(w, l, "after restart")
		if l.lastAttempted > l.lastAcked {
			pending++
			if before == l.lastAttempted {
				landed++
			}
		}
		// Waits until a lease orphaned by the crash expires.
		lease, err := c.Acquire(ctx, wire.AcquireRequest{Key: l.key, Owner: "crash-verifier", TTLSeconds: 10, BlockSecs: 10})
		if err != nil {
			t.Fatalf("acquire %s after restart: %v", l.key, err)
		}
		if lease.FencingToken <= l.maxToken {
			t.Errorf("%s: fencing token %d after restart, but %d was handed out before the crash", l.key, lease.FencingToken, l.maxToken)
		}
		l.maxToken = max(l.maxToken, lease.FencingToken)
		// Whatever a crashed transaction left behind is settled now; the
		// committed value may only have moved forward.
		if after := read(w, l, "after re-acquire"); after < before {
			t.Errorf("%s: committed counter went back from %d to %d", l.key, before, after)
		}
		if err := lease.Release(ctx, true); err != nil {
			t.Fatalf("release %s: %v", l.key, err)
		}
	}
	t.Logf("after restart: %d writers had an unacknowledged last write, %d of those were committed", pending, landed)
}
