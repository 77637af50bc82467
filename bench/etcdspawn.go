package bench

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/xid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/raftlockd/raftlockd/auth"
)

// EtcdOptions set up a spawned etcd cluster.
type EtcdOptions struct {
	// Heartbeat and Election are etcd's --heartbeat-interval and
	// --election-timeout (etcd's defaults, 100ms and 1s, when zero).
	Heartbeat, Election time.Duration
}

// EtcdCluster is a set of `etcd` processes on loopback, the peer the bench
// compares raftlockd with. Like the raftlockd cluster it serves clients and
// peers over mutual TLS, with certificates of a CA made for the run.
type EtcdCluster struct {
	Bin   string
	Dir   string
	Nodes []*Proc
	tls   *tls.Config
}

// pemFiles writes b's certificate, key and CA as the separate PEM files
// etcd reads.
func pemFiles(b *auth.Bundle, dir, name string) (cert, key, ca string, err error) {
	raw, err := b.Encode()
	if err != nil {
		return "", "", "", fmt.Errorf("bench: %w", err)
	}
	var blocks []*pem.Block
	for {
		var blk *pem.Block
		if blk, raw = pem.Decode(raw); blk == nil {
			break
		}
		blocks = append(blocks, blk)
	}
	if len(blocks) < 3 {
		return "", "", "", fmt.Errorf("bench: bundle of %s holds %d PEM blocks, want certificate, key and CA", name, len(blocks))
	}
	cert, key, ca = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "etcd-ca.crt")
	for path, blk := range map[string]*pem.Block{cert: blocks[0], key: blocks[1], ca: blocks[2]} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			return "", "", "", fmt.Errorf("bench: %w", err)
		}
	}
	return cert, key, ca, nil
}

// SpawnEtcd starts n etcd members forming one new cluster, with data
// directories under dir, and waits until each of them serves a
// linearizable read.
func SpawnEtcd(ctx context.Context, bin, dir string, n int, o EtcdOptions) (*EtcdCluster, error) {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "etcd bench CA"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cl, err := ca.Issue(auth.RoleClient, auth.IssueOptions{Name: "etcd bench client"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	c := &EtcdCluster{Bin: bin, Dir: dir, tls: auth.ClientConfig(cl)}
	type addrs struct{ client, peer string }
	all := make([]addrs, n)
	var initial []string
	for i := range all {
		for _, p := range []*string{&all[i].client, &all[i].peer} {
			a, err := freeAddr()
			if err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			*p = "https://" + a
		}
		initial = append(initial, fmt.Sprintf("etcd%d=%s", i+1, all[i].peer))
	}
	token := "raftlockd-bench-" + xid.New().String()
	for i, a := range all {
		name := fmt.Sprintf("etcd%d", i+1)
		srv, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: name, Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		cert, key, caFile, err := pemFiles(srv, dir, name)
		if err != nil {
			return nil, err
		}
		args := []string{"--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", a.client, "--advertise-client-urls", a.client,
			"--listen-peer-urls", a.peer, "--initial-advertise-peer-urls", a.peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--cert-file", cert, "--key-file", key, "--trusted-ca-file", caFile, "--client-cert-auth",
			"--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", caFile, "--peer-client-cert-auth",
			"--logger", "zap", "--log-level", "warn"}
		if o.Heartbeat > 0 {
			args = append(args, "--heartbeat-interval", fmt.Sprint(o.Heartbeat.Milliseconds()))
		}
		if o.Election > 0 {
			args = append(args, "--election-timeout", fmt.Sprint(o.Election.Milliseconds()))
		}
		c.Nodes = append(c.Nodes, &Proc{Name: name, API: a.client, args: args})
	}
	for _, p := range c.Nodes {
		if err := p.start(bin, dir); err != nil {
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

// Client returns a client of the members at endpoints (default: every
// running member); the caller closes it.
func (c *EtcdCluster) Client(endpoints ...string) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: c.tls, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("bench: etcd client: %w", err)
	}
	return cl, nil
}

// Endpoints lists the client URLs of the running members.
func (c *EtcdCluster) Endpoints() []string {
	var out []string
	for _, p := range c.Nodes {
		if p.cmd != nil {
			out = append(out, p.API)
		}
	}
	return out
}

// WaitReady waits until member i answers a linearizable read (which takes
// a leader).
func (c *EtcdCluster) WaitReady(ctx context.Context, i int) error {
	p := c.Nodes[i]
	cl, err := c.Client(p.API)
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = cl.Get(rctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("bench: %s not ready after 30s (log %s): %w", p.Name, filepath.Join(c.Dir, p.Name+".log"), err)
}

// Leader returns the index of the member that reports leading, or -1.
func (c *EtcdCluster) Leader(ctx context.Context) int {
	for i, p := range c.Nodes {
		if p.cmd == nil {
			continue
		}
		cl, err := c.Client(p.API)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cl.Status(sctx, p.API)
		cancel()
		cl.Close()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// Pids lists the process ids of the running members.
func (c *EtcdCluster) Pids() []int { return pids(c.Nodes) }

// Stop ends every member.
func (c *EtcdCluster) Stop() {
	for _, p := range c.Nodes {
		p.kill()
	}
}

// FailoverRound kills the leader (SIGKILL), times how long it takes until
// a put through a surviving member is acknowledged (see firstAck), restarts
// the killed member and waits until it serves reads again: raftlockd's
// method (Cluster.FailoverRound) applied to etcd.
func (c *EtcdCluster) FailoverRound(ctx context.Context, r int) (time.Duration, error) {
	leader := -1
	for deadline := time.Now().Add(20 * time.Second); leader < 0; {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bench: etcd has no leader")
		}
		if leader = c.Leader(ctx); leader < 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	cl, err := c.Client(c.Nodes[(leader+1)%len(c.Nodes)].API)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	key := fmt.Sprintf("%sfailover/%d-%d", etcdPrefix, r, time.Now().UnixNano())
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = cl.Put(wctx, key+"-warm", "x")
	cancel()
	if err != nil {
		return 0, fmt.Errorf("bench: etcd write before the kill: %w", err)
	}
	took, err := afterKill(ctx, c.Nodes[leader].kill, func(ctx context.Context, i int) error {
		_, err := cl.Put(ctx, fmt.Sprintf("%s-%d", key, i), "x")
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := c.Nodes[leader].start(c.Bin, c.Dir); err != nil {
		return took, err
	}
	if err := c.WaitReady(ctx, leader); err != nil {
		return took, err
	}
	return took, nil
}
