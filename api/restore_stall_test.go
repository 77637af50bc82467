package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
)

// A follower forwarding a restore to a leader that stops answering in the
// middle of the upload (a paused process, a cut network) gives up once
// another server leads: the client gets a retryable 503, not an answer
// only when it stops waiting itself.
func TestARestoreForwardedToALeaderThatStallsEndsOnceAnotherLeads(t *testing.T) {
	links := map[string]*testutil.Proxy{}
	c := testcluster.Start(t, 3, testcluster.Configure(func(s *config.Server) {
		// Each node's API is reached by its peers through a link the test
		// can stall.
		links[s.NodeID] = testutil.NewProxy(t, s.Listen)
		s.APIAdvertise = links[s.NodeID].URL()
	}))
	leader := c.WaitLeader(10 * time.Second)
	follower := (leader + 1) % 3
	fe := envOf(t, c.Nodes[follower].Server).operator()
	fe.commitDoc("a", `{"a":1}`)
	backup := fe.saveSnapshot()

	pr, pw := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fe.url+"/v1/cluster/snapshot", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(backup))
	req.Header.Set("Content-Type", "application/octet-stream")
	type answer struct {
		status int
		body   []byte
		header http.Header
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := fe.hc.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		answered <- answer{status: res.StatusCode, body: b, header: res.Header, err: err}
	}()
	// Half of the upload reaches the leader, which stores it as it comes.
	half := len(backup) / 2
	if _, err := pw.Write(backup[:half]); err != nil {
		t.Fatal(err)
	}
	// The leader stores it; on a busy machine that may be another server
	// than the one that led a moment ago.
	stored := -1
	testutil.WaitFor(t, 30*time.Second, "the leader to store the first half of the upload", func() bool {
		select {
		case a := <-answered:
			t.Fatalf("the restore was answered before its upload ended: %d %s %v", a.status, a.body, a.err)
		default:
		}
		for i := range c.Nodes {
			files, _ := filepath.Glob(filepath.Join(c.Nodes[i].Config.DataDir, "restore-*.upload"))
			for _, f := range files {
				if st, err := os.Stat(f); err == nil && st.Size() > 0 {
					stored = i
					return true
				}
			}
		}
		return false
	})
	if stored == follower {
		t.Logf("%s, which was to forward the restore, leads by now: the case is not exercised", c.Nodes[follower].Name)
		return
	}
	leader = stored
	links[c.Nodes[leader].Name].Hold()
	c.Freeze(leader)
	defer func() {
		c.Thaw(leader)
		links[c.Nodes[leader].Name].Release()
	}()
	go func() {
		_, _ = io.Copy(pw, bytes.NewReader(backup[half:]))
		_ = pw.Close()
	}()
	testutil.WaitFor(t, 20*time.Second, "another server to lead", func() bool {
		id, _ := c.Nodes[follower].Server.Node().Leader()
		return id != "" && id != c.Nodes[leader].Name
	})
	start := time.Now()
	select {
	case a := <-answered:
		if a.err != nil {
			t.Fatalf("the restore ended without an answer: %v", a.err)
		}
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
			t.Fatalf("the restore answered %d %s (Retry-After %q)", a.status, a.body, a.header.Get("Retry-After"))
		}
	case <-time.After(10 * time.Second):
		cancel()
		a := <-answered
		t.Fatalf("no answer %s after another server led (then: %v %v)", time.Since(start).Round(time.Second),
			a.err, errors.Is(a.err, context.Canceled))
	}
}
