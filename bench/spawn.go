package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Cluster is a set of `raftlockd server` processes on loopback, started by
// the bench tool so that a measurement covers the real binary, real
// processes and real Raft traffic between them.
type Cluster struct {
	Bin     string
	Dir     string
	Timeout time.Duration // Raft heartbeat and election timeout
	Nodes   []*Proc
}

// Proc is one server process.
type Proc struct {
	Name   string
	API    string // http://host:port
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
// every node is ready.
func SpawnCluster(ctx context.Context, bin, dir string, n int, raftTimeout time.Duration) (*Cluster, error) {
	c := &Cluster{Bin: bin, Dir: dir, Timeout: raftTimeout}
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
		p := &Proc{Name: name, API: "http://" + a.api, args: []string{"server",
			"--node-id", name, "--data-dir", filepath.Join(dir, name),
			"--listen", a.api, "--raft-listen", a.raft, "--gossip-listen", a.gossip,
			"--join", strings.Join(gossip, ","), "--bootstrap-expect", fmt.Sprint(n), "--gossip-profile", "fast",
			"--raft-heartbeat-timeout", raftTimeout.String(), "--raft-election-timeout", raftTimeout.String(),
			"--leader-wait", "2s", "--log-level", "warn"}}
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
func (c *Cluster) Start(i int) error {
	p := c.Nodes[i]
	f, err := os.OpenFile(filepath.Join(c.Dir, p.Name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.Bin, p.args...)
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

// WaitReady waits until node i answers /readyz.
func (c *Cluster) WaitReady(ctx context.Context, i int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if resp, err := http.Get(c.Nodes[i].API + "/readyz"); err == nil {
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
func (c *Cluster) Kill(i int) {
	if p := c.Nodes[i]; p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		p.cmd = nil
	}
}

// Stop ends every process.
func (c *Cluster) Stop() {
	for i := range c.Nodes {
		c.Kill(i)
	}
}

// Leader returns the index of the node that reports leading, or -1.
func (c *Cluster) Leader() int {
	for i, p := range c.Nodes {
		if p.cmd == nil {
			continue
		}
		resp, err := http.Get(p.API + "/metrics")
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
			return i
		}
	}
	return -1
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
		leader := -1
		for deadline := time.Now().Add(20 * time.Second); leader < 0; {
			if time.Now().After(deadline) {
				return out, fmt.Errorf("bench: no leader")
			}
			leader = c.Leader()
			time.Sleep(20 * time.Millisecond)
		}
		survivor := c.Nodes[(leader+1)%len(c.Nodes)]
		cl, err := client.New(survivor.API, client.WithRetry(0),
			client.WithHTTPClient(&http.Client{Timeout: 5 * time.Second}))
		if err != nil {
			return out, err
		}
		write := func(key string) error {
			l, err := cl.Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "failover", TTLSeconds: 5, BlockSecs: -1})
			if err != nil {
				return err
			}
			return l.Release(ctx, false)
		}
		if err := write(fmt.Sprintf("failover-warm-%d", r)); err != nil {
			return out, fmt.Errorf("bench: write before the kill: %w", err)
		}
		c.Kill(leader)
		start := time.Now()
		for i := 0; ; i++ {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if _, err := cl.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("failover-%d-%d", r, i), Owner: "failover",
				TTLSeconds: 5, BlockSecs: -1}); err == nil {
				break
			}
			if time.Since(start) > 30*time.Second {
				return out, fmt.Errorf("bench: no write acknowledged within 30s of the kill")
			}
		}
		out = append(out, time.Since(start))
		if err := c.Start(leader); err != nil {
			return out, err
		}
		if err := c.WaitReady(ctx, leader); err != nil {
			return out, err
		}
	}
	return out, nil
}
