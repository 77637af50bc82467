package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Cluster is a set of `raftlockd server` processes on loopback, started by
// the bench tool so that a measurement covers the real binary, real
// processes and real Raft traffic between them. The nodes talk mutual TLS
// with bundles of a CA made for the cluster (kept in Dir).
type Cluster struct {
	Bin     string
	Dir     string
	Timeout time.Duration // Raft heartbeat and election timeout
	Nodes   []*Proc
	// Client is a client bundle of the cluster's CA allowed every
	// namespace: what the bench's clients present.
	Client *auth.Bundle
	// Admin is a server bundle of the cluster's CA, for the operator's
	// endpoints (the profiler).
	Admin *auth.Bundle
}

// Proc is one server process.
type Proc struct {
	Name   string
	API    string // https://host:port
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// SpawnCluster starts n servers that bootstrap one cluster and waits until
// every node is ready; extra flags are passed to every server.
func SpawnCluster(ctx context.Context, bin, dir string, n int, raftTimeout time.Duration, extra ...string) (*Cluster, error) {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "raftlockd bench CA"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cl, err := ca.Issue(auth.RoleClient, auth.IssueOptions{Name: "raftlockd bench",
		Perms: []auth.Perm{{Namespace: "*", Write: true}}})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	admin, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: "raftlockd bench operator"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := ca.WriteFile(filepath.Join(dir, auth.CAFile)); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	c := &Cluster{Bin: bin, Dir: dir, Timeout: raftTimeout, Client: cl, Admin: admin}
	var gossip []string
	type addrs struct{ api, raft, gossip string }
	all := make([]addrs, n)
	for i := range all {
		for _, p := range []*string{&all[i].api, &all[i].raft, &all[i].gossip} {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			*p = a
		}
		gossip = append(gossip, all[i].gossip)
	}
	for i, a := range all {
		name := fmt.Sprintf("n%d", i+1)
		srv, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: name, Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		bundle := filepath.Join(dir, name+".pem")
		if err := srv.WriteFile(bundle); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		p := &Proc{Name: name, API: "https://" + a.api, args: []string{"server",
			"--node-id", name, "--data-dir", filepath.Join(dir, name), "--bundle", bundle,
			"--listen", a.api, "--raft-listen", a.raft, "--gossip-listen", a.gossip,
			"--join", strings.Join(gossip, ","), "--bootstrap-expect", fmt.Sprint(n), "--gossip-profile", "fast",
			"--raft-heartbeat-timeout", raftTimeout.String(), "--raft-election-timeout", raftTimeout.String(),
			"--leader-wait", "2s", "--log-level", "warn"}}
		p.args = append(p.args, extra...)
		c.Nodes = append(c.Nodes, p)
	}
	for i := range c.Nodes {
		if err := c.Start(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for i := range c.Nodes {
		if err := c.WaitReady(ctx, i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// Start (re)starts node i with its original flags and data directory.
func (c *Cluster) Start(i int) error { return c.Nodes[i].start(c.Bin, c.Dir) }

// start runs bin with the process's flags, its output appended to
// <dir>/<name>.log.
func (p *Proc) start(bin, dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, p.Name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	cmd := exec.Command(bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("bench: start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

// kill sends SIGKILL to the process and waits for it to end.
func (p *Proc) kill() {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		p.cmd = nil
	}
}

// pids lists the process ids of the running processes of procs.
func pids(procs []*Proc) []int {
	var out []int
	for _, p := range procs {
		if p.cmd != nil {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

// TLS is what the bench's clients dial the nodes with.
func (c *Cluster) TLS() *tls.Config { return auth.ClientConfig(c.Client) }

// http is a client for short requests to the nodes.
func (c *Cluster) http() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c.TLS(), DisableKeepAlives: true}}
}

// WaitReady waits until node i answers /readyz.
func (c *Cluster) WaitReady(ctx context.Context, i int) error {
	hc := c.http()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if resp, err := hc.Get(c.Nodes[i].API + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("bench: %s not ready after 30s (log %s)", c.Nodes[i].Name, filepath.Join(c.Dir, c.Nodes[i].Name+".log"))
}

// Kill sends SIGKILL to node i.
func (c *Cluster) Kill(i int) { c.Nodes[i].kill() }

// Pids lists the process ids of the running nodes.
func (c *Cluster) Pids() []int { return pids(c.Nodes) }

// Stop ends every process.
func (c *Cluster) Stop() {
	for i := range c.Nodes {
		c.Kill(i)
	}
}

// Leader returns the index of the node that reports leading, or -1 when
// none does or more than one does (a deposed leader that has yet to notice).
func (c *Cluster) Leader() int {
	hc := c.http()
	leader := -1
	for i, p := range c.Nodes {
		if p.cmd == nil {
			continue
		}
		resp, err := hc.Get(p.API + "/metrics")
		if err != nil {
			continue
		}
		leads := false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "raftlockd_raft_is_leader 1" {
				leads = true
			}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if leads {
			if leader >= 0 {
				return -1
			}
			leader = i
		}
	}
	return leader
}

// Endpoints lists the API endpoints of the running nodes.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, p := range c.Nodes {
		if p.cmd != nil {
			out = append(out, p.API)
		}
	}
	return out
}

// Failover measures, rounds times, how long after the leader is killed
// (SIGKILL) the first write through a surviving node is acknowledged. The
// killed node is restarted between rounds.
func Failover(ctx context.Context, c *Cluster, rounds int) ([]time.Duration, error) {
	var out []time.Duration
	for r := 0; r < rounds; r++ {
		d, err := c.FailoverRound(ctx, r)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// FailoverRound kills the leader (SIGKILL), times how long it takes until a
// write (an acquire) through a surviving node is acknowledged (see
// firstAck), restarts the killed node and waits until it is ready.
func (c *Cluster) FailoverRound(ctx context.Context, r int) (time.Duration, error) {
	for range 10 {
		took, err := c.failoverRound(ctx, r)
		if !errors.Is(err, errLeaderMoved) {
			return took, err
		}
	}
	return 0, fmt.Errorf("bench: %w ten times in a row", errLeaderMoved)
}

// errLeaderMoved says leadership moved before the leader was killed:
// killing the old one would time nothing.
var errLeaderMoved = errors.New("leadership moved before the kill")

func (c *Cluster) failoverRound(ctx context.Context, r int) (time.Duration, error) {
	leader := -1
	for deadline := time.Now().Add(20 * time.Second); leader < 0; {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bench: no leader")
		}
		leader = c.Leader()
		time.Sleep(20 * time.Millisecond)
	}
	survivor := c.Nodes[(leader+1)%len(c.Nodes)]
	cl, err := client.New(survivor.API, client.WithRetry(0), client.WithHTTPClient(&http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: c.TLS()}}))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	write := func(key string) error {
		l, err := cl.Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "failover", TTLSeconds: 5, BlockSecs: -1})
		if err != nil {
			return err
		}
		return l.Release(ctx, false)
	}
	if err := write(fmt.Sprintf("failover-warm-%d-%d", r, time.Now().UnixNano())); err != nil {
		return 0, fmt.Errorf("bench: write before the kill: %w", err)
	}
	if now := c.Leader(); now != leader {
		// The node restarted by the round before may have called an
		// election: look again.
		return 0, errLeaderMoved
	}
	took, err := afterKill(ctx, func() { c.Kill(leader) }, func(ctx context.Context, i int) error {
		_, err := cl.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("failover-%d-%d-%d", r, time.Now().UnixNano(), i),
			Owner: "failover", TTLSeconds: 5, BlockSecs: -1})
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := c.Start(leader); err != nil {
		return took, err
	}
	if err := c.WaitReady(ctx, leader); err != nil {
		return took, err
	}
	return took, nil
}

// adminHTTP is a client for the operator's endpoints, with timeout.
func (c *Cluster) adminHTTP(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: auth.ClientConfig(c.Admin), DisableKeepAlives: true}}
}

// Profile writes a CPU profile of node i over the next d to path. The node
// must serve the profiler (started with --pprof).
func (c *Cluster) Profile(ctx context.Context, i int, d time.Duration, path string) error {
	secs := max(1, int((d+time.Second-1)/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", c.Nodes[i].API, secs), nil)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	resp, err := c.adminHTTP(time.Duration(secs)*time.Second + 30*time.Second).Do(req)
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", c.Nodes[i].Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("bench: profile %s: HTTP %d: %s", c.Nodes[i].Name, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("bench: profile %s: %w", c.Nodes[i].Name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// Metrics returns the samples node i exports on /metrics, by series
// (name with labels, as exported).
func (c *Cluster) Metrics(ctx context.Context, i int) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Nodes[i].API+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: metrics of %s: %w", c.Nodes[i].Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: metrics of %s: HTTP %d", c.Nodes[i].Name, resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}

// Failover writes: one is started every failoverEvery from the kill on,
// each given failoverAttempt, for at most failoverLimit.
const (
	failoverEvery   = 10 * time.Millisecond
	failoverAttempt = 5 * time.Second
	failoverLimit   = 30 * time.Second
)

// afterKill runs kill, which sends SIGKILL and returns once the process
// has ended, and returns the time from the signal (not from the end of the
// process, which a process busy in the kernel, in an fsync say, delays) to
// the first acknowledged write (see firstAck).
func afterKill(ctx context.Context, kill func(), write func(ctx context.Context, i int) error) (time.Duration, error) {
	start := time.Now()
	kill()
	return firstAck(ctx, start, write)
}

// firstAck starts write(ctx, i) every failoverEvery from start on, each
// attempt concurrently and bounded by failoverAttempt, and returns the time
// from start to the first acknowledged one. Overlapping attempts keep the
// measurement independent of how a system treats a write sent while it
// has no leader: one that waits for the next leader and one that is
// dropped (and times out) both yield the moment writes work again, within
// failoverEvery.
func firstAck(ctx context.Context, start time.Time, write func(ctx context.Context, i int) error) (time.Duration, error) {
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	acked := make(chan time.Duration, 1)
	var last error
	var mu sync.Mutex
	tick := time.NewTicker(failoverEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			wctx, done := context.WithTimeout(actx, failoverAttempt)
			defer done()
			if err := write(wctx, i); err != nil {
				mu.Lock()
				last = err
				mu.Unlock()
				return
			}
			select {
			case acked <- time.Since(start):
			default:
			}
		}(i)
		select {
		case d := <-acked:
			return d, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		if time.Since(start) > failoverLimit {
			mu.Lock()
			defer mu.Unlock()
			return 0, fmt.Errorf("bench: no write acknowledged within %s of the kill: %w", failoverLimit, last)
		}
	}
}
