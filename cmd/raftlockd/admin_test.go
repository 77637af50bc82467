package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// TestCLISnapshotSaveRestore backs a server up with `snapshot save`,
// changes its state and brings the backup back with `snapshot restore`.
func TestCLISnapshotSaveRestore(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := srv.clientEnv()
	commitDoc := func(doc string) map[string]string {
		t.Helper()
		lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k"))
		held := srv.clientEnv(envList(lease)...)
		mustCLI(t, held, doc, "client", "update")
		mustCLI(t, held, "", "client", "release")
		return lease
	}
	commitDoc(`{"v":1}`)

	dir := t.TempDir()
	file := filepath.Join(dir, "backup.db")
	res := cli(t, env, "", "snapshot", "save", file)
	if res.code != 0 || res.stdout != "" || !strings.Contains(res.stderr, "saved snapshot to "+file) {
		t.Fatalf("snapshot save: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("save left %d files in the directory, want the snapshot and its checksum", len(entries))
	}
	saved, err := os.ReadFile(file)
	if err != nil || len(saved) == 0 {
		t.Fatalf("saved snapshot: %v", err)
	}
	sum := sha256.Sum256(saved)
	if got, _ := os.ReadFile(file + ".sha256"); string(got) != hex.EncodeToString(sum[:])+"  backup.db\n" {
		t.Fatalf("checksum file %q", got)
	}

	second := commitDoc(`{"v":2}`)
	// A copy damaged since it was saved is refused before anything is sent.
	damaged := filepath.Join(dir, "damaged.db")
	flipped := bytes.Clone(saved)
	flipped[len(flipped)/2] ^= 0x40
	if err := os.WriteFile(damaged, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(damaged+".sha256", []byte(hex.EncodeToString(sum[:])+"  damaged.db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := cli(t, env, "", "snapshot", "restore", damaged); res.code == 0 || !strings.Contains(res.stderr, damaged+" is damaged") {
		t.Fatalf("restore of a damaged copy: exit %d, stderr %q", res.code, res.stderr)
	}
	wantJSON(t, "state after the damaged copy", mustCLI(t, env, "", "client", "get", "--key", "k"), `{"v":2}`)
	res = cli(t, env, "", "snapshot", "restore", file)
	if res.code != 0 || !strings.Contains(res.stderr, "restored snapshot from "+file) || !strings.Contains(res.stderr, "matches "+file+".sha256") {
		t.Fatalf("snapshot restore: exit %d, stderr %q", res.code, res.stderr)
	}
	wantJSON(t, "state after restore", mustCLI(t, env, "", "client", "get", "--key", "k"), `{"v":1}`)
	wantJSON(t, "stale read after restore", mustCLI(t, env, "", "client", "get", "--key", "k", "--stale"), `{"v":1}`)
	// Fencing tokens do not go back with the state.
	next := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k"))
	after, _ := strconv.Atoi(next["RAFTLOCKD_CLIENT_FENCING_TOKEN"])
	before, _ := strconv.Atoi(second["RAFTLOCKD_CLIENT_FENCING_TOKEN"])
	if before == 0 || after <= before {
		t.Fatalf("token after restore %d, before it %d", after, before)
	}
	mustCLI(t, srv.clientEnv(envList(next)...), "", "client", "release")

	bad := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(bad, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{{bad, "invalid_snapshot"}, {filepath.Join(dir, "missing.db"), "missing.db"}} {
		if res := cli(t, env, "", "snapshot", "restore", c.file); res.code == 0 || !strings.Contains(res.stderr, c.want) {
			t.Fatalf("restore of %s: exit %d, stderr %q; want failure naming %s", c.file, res.code, res.stderr, c.want)
		}
	}
	wantJSON(t, "state after refused restores", mustCLI(t, env, "", "client", "get", "--key", "k"), `{"v":1}`)
}

// TestCLIClusterCommands runs the membership commands against one server.
func TestCLIClusterCommands(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := srv.clientEnv()

	var st wire.ClusterStatusResponse
	if err := json.Unmarshal([]byte(mustCLI(t, env, "", "cluster", "status", "--format", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.NodeID == "" || st.State != "Leader" || st.LeaderID != st.NodeID || st.LeaderEndpoint != srv.url || st.Joining {
		t.Fatalf("cluster status: %+v", st)
	}
	table := mustCLI(t, env, "", "cluster", "status")
	for _, want := range []string{"state", "Leader", st.NodeID + " (" + srv.url + ")", "takes part"} {
		if !strings.Contains(table, want) {
			t.Fatalf("status table lacks %q:\n%s", want, table)
		}
	}

	lines := strings.Split(strings.TrimSpace(mustCLI(t, env, "", "cluster", "members")), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "APPLIED") {
		t.Fatalf("members table:\n%s", strings.Join(lines, "\n"))
	}
	if f := strings.Fields(lines[1]); len(f) < 4 || f[0] != st.NodeID || f[1] != "voter" || f[2] != "alive" || f[3] != "Leader" {
		t.Fatalf("members row: %q", lines[1])
	}
	var m wire.ClusterMembersResponse
	if err := json.Unmarshal([]byte(mustCLI(t, env, "", "cluster", "members", "--format", "json")), &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Members) != 1 || m.Members[0].Raft == nil || m.Members[0].Raft.AppliedIndex == 0 {
		t.Fatalf("members JSON: %+v", m)
	}
	if out := strings.TrimSpace(mustCLI(t, env, "", "tc", "list")); out != srv.url {
		t.Fatalf("tc list printed %q, want %s", out, srv.url)
	}
	mustCLI(t, env, "", "tc", "announce", "--self", srv.url)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "leave"}, "last_voter"},
		{[]string{"tc", "leave"}, "last_voter"},
		{[]string{"cluster", "remove-peer", "nobody"}, "not_found"},
		{[]string{"cluster", "members", "--format", "yaml"}, "--format"},
		// A command that changes something is refused before it is sent.
		{[]string{"cluster", "leave", "--format", "yaml"}, "--format"},
		{[]string{"tc", "announce", "--self", "https://127.0.0.1:2", "--format", "yaml"}, "--format"},
		{[]string{"tc", "announce", "--self", "http://127.0.0.1:1"}, "not_found"},
	} {
		if res := cli(t, env, "", c.args...); res.code == 0 || !strings.Contains(res.stderr, c.want) {
			t.Errorf("raftlockd %s: exit %d, stderr %q; want failure naming %s", strings.Join(c.args, " "), res.code,
				res.stderr, c.want)
		}
	}
	if out := strings.TrimSpace(mustCLI(t, env, "", "tc", "list")); out != srv.url {
		t.Fatalf("after the refused announce tc list printed %q, want %s", out, srv.url)
	}
}

// TestCLIClusterLeaveExitsZero: in a two-node cluster `cluster leave`
// makes the server leave the voter set and its process exit 0.
func TestCLIClusterLeaveExitsZero(t *testing.T) {
	t.Parallel()
	type node struct {
		dir, listen string
		args        []string
	}
	gossip := []string{testutil.FreeAddr(t), testutil.FreeAddr(t)}
	var nodes []node
	for i := range gossip {
		n := node{dir: t.TempDir(), listen: testutil.FreeAddr(t)}
		n.args = append(serverFlags(n.dir, n.listen, testutil.FreeAddr(t)),
			"--gossip-listen", gossip[i], "--join", strings.Join(gossip, ","), "--bootstrap-expect", "2")
		nodes = append(nodes, n)
	}
	shareCA(t, nodes[0].dir, nodes[1].dir)
	var procs []*serverProc
	for _, n := range nodes {
		procs = append(procs, spawnServer(t, n.listen, n.args, nil))
	}
	for i, p := range procs {
		if err := p.waitReady(nodes[i].dir, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	voters := func() []string {
		var m wire.ClusterMembersResponse
		if err := json.Unmarshal([]byte(mustCLI(t, procs[0].clientEnv(), "", "cluster", "members", "--format", "json")), &m); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, mem := range m.Members {
			if mem.Suffrage == "voter" {
				ids = append(ids, mem.ID)
			}
		}
		return ids
	}
	testutil.WaitFor(t, 20*time.Second, "both nodes to be voters", func() bool { return len(voters()) == 2 })

	ids := make([]string, 2)
	for i, n := range nodes {
		raw, err := os.ReadFile(filepath.Join(n.dir, "node-id"))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = strings.TrimSpace(string(raw))
	}
	out := mustCLI(t, procs[1].clientEnv(), "", "cluster", "leave")
	if !strings.Contains(out, "node "+ids[1]+" left the cluster") {
		t.Fatalf("leave printed %q", out)
	}
	select {
	case <-procs[1].done:
	case <-time.After(20 * time.Second):
		t.Fatal("the server that left is still running")
	}
	if procs[1].waitErr != nil {
		t.Fatalf("the server that left exited with %v; output:\n%s", procs[1].waitErr, procs[1].log.String())
	}
	if got := voters(); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("voters after %s left: %v", ids[1], got)
	}
	// The remaining server tells the departure from a failure.
	testutil.WaitFor(t, 10*time.Second, "the server that left to be listed as left", func() bool {
		for _, l := range strings.Split(mustCLI(t, procs[0].clientEnv(), "", "cluster", "members"), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[0] == ids[1] {
				return f[1] == "none" && f[2] == "left"
			}
		}
		return false
	})
	lease := parseExports(t, mustCLI(t, procs[0].clientEnv(), "", "client", "acquire", "--key", "still-serving"))
	mustCLI(t, procs[0].clientEnv(envList(lease)...), "", "client", "release")
}

// Progress lines come at most every interval, only once a transfer has run
// that long, and name bytes and rate.
func TestProgressOutput(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	p := &progress{w: &buf, verb: "sent", now: func() time.Time { return clock }, every: 500 * time.Millisecond}
	p.start, p.last = clock, clock
	for i := int64(1); i <= 40; i++ {
		clock = clock.Add(100 * time.Millisecond)
		p.update(i<<20, 40<<20)
	}
	p.finish("restored snapshot from f", 40<<20)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 9 {
		t.Fatalf("%d lines for a 4s transfer, want 8 progress lines and a summary:\n%s", len(lines), buf.String())
	}
	if lines[0] != "sent 5.0 MiB of 40.0 MiB (12%) at 10.0 MiB/s" {
		t.Fatalf("first progress line %q", lines[0])
	}
	if lines[8] != "restored snapshot from f: 40.0 MiB in 4s (10.0 MiB/s)" {
		t.Fatalf("summary %q", lines[8])
	}

	buf.Reset()
	quick := newProgress(&buf, "received")
	quick.update(1000, 1000)
	if buf.Len() != 0 {
		t.Fatalf("a quick transfer printed %q", buf.String())
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// remove-peer of a server that still runs says what it does next.
func TestRemovePeerOutput(t *testing.T) {
	var buf bytes.Buffer
	removedTable(&buf, &wire.RemovePeerResponse{Removed: true, ID: "n2"})
	if buf.String() != "removed n2\n" {
		t.Fatalf("removal of a stopped server: %q", buf.String())
	}
	buf.Reset()
	removedTable(&buf, &wire.RemovePeerResponse{Removed: true, ID: "n2", Running: true})
	if out := buf.String(); !strings.HasPrefix(out, "removed n2\nn2 is still running") || !strings.Contains(out, "no_leader") ||
		!strings.Contains(out, "restarted") || !strings.Contains(out, "cluster leave") {
		t.Fatalf("removal of a running server: %q", out)
	}
}

func TestLastContactText(t *testing.T) {
	for _, c := range []struct {
		state string
		ms    int64
		want  string
	}{{"Leader", 0, "-"}, {"Follower", -1, "never"}, {"Candidate", -1, "never"}, {"Follower", 0, "0s"}, {"Follower", 1500, "1.5s"}} {
		if got := lastContact(c.state, c.ms); got != c.want {
			t.Errorf("lastContact(%s, %d) = %q, want %q", c.state, c.ms, got, c.want)
		}
	}
}

// A restore whose connection ends after the upload, before any answer,
// says that its outcome is unknown and how to settle it, rather than only
// the transport's error.
func TestCLIRestoreCutOffBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close() // the leader died before answering
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	file := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(file, bytes.Repeat([]byte("x"), 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	res := cli(t, []string{"RAFTLOCKD_CLIENT_SERVER=http://" + ln.Addr().String()}, "", "snapshot", "restore", file)
	if res.code == 0 || !strings.Contains(res.stderr, "may or may not have happened") || !strings.Contains(res.stderr, "64.0 KiB of 64.0 KiB") {
		t.Fatalf("restore cut off before the answer: exit %d, stderr %q", res.code, res.stderr)
	}
}

// Membership commands give up on a server that never answers (a paused
// process) after a minute by default; a snapshot, which may take long,
// has no limit unless one is given.
func TestOperatorCommandsHaveAFiniteDefaultTimeout(t *testing.T) {
	for _, c := range []struct {
		cmd  *cobra.Command
		want string
	}{{newClusterCmd(), "1m0s"}, {newTCCmd(), "1m0s"}, {newSnapshotCmd(), "0s"}} {
		if got := c.cmd.PersistentFlags().Lookup("timeout").DefValue; got != c.want {
			t.Errorf("%s --timeout defaults to %s, want %s", c.cmd.Name(), got, c.want)
		}
	}
}

// A `snapshot save` interrupted (Ctrl-C, or SIGTERM from a job's timeout)
// while the snapshot streams leaves nothing behind in the directory: not
// the partial file, nor the temporary file it was written to.
func TestCLISnapshotSaveInterruptedLeavesNoFiles(t *testing.T) {
	t.Parallel()
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		ln, err := net.Listen("tcp", testutil.FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(64<<20))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10))
			http.NewResponseController(w).Flush()
			select { // a large snapshot still streaming
			case <-stop:
			case <-r.Context().Done():
			}
		})}
		go func() { _ = srv.Serve(ln) }()
		dir := t.TempDir()
		cmd := exec.Command(testutil.Binary(t), "snapshot", "save", filepath.Join(dir, "backup.db"))
		cmd.Env = baseEnv(t, "RAFTLOCKD_CLIENT_SERVER=http://"+ln.Addr().String())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the save to write part of the snapshot", func() bool {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if fi, err := e.Info(); err == nil && fi.Size() > 0 {
					return true
				}
			}
			return false
		})
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err = <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("%v: snapshot save still runs 10 s after it", sig)
		}
		close(stop)
		srv.Close()
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("%v: snapshot save left %q behind (stderr %q)", sig, names, stderr.String())
		}
		if err == nil || !strings.Contains(stderr.String(), "interrupted") {
			t.Fatalf("%v: snapshot save exited with %v, stderr %q; want a failure that says it was interrupted", sig, err, stderr.String())
		}
	}
}
