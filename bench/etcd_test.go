package bench

import (
	"context"
	"os/exec"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdDriver runs every workload of the etcd driver against one real
// etcd process (the etcd binary on PATH; Debian: etcd-server).
func TestEtcdDriver(t *testing.T) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("SKIPPED: no etcd binary on PATH (apt-get install etcd-server): the etcd driver is not exercised")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ec, err := SpawnEtcd(ctx, bin, t.TempDir(), 1, EtcdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Stop()
	if got := ec.Leader(ctx); got != 0 {
		t.Fatalf("leader %d, want the only member", got)
	}
	if len(ec.Pids()) != 1 {
		t.Fatalf("pids %v", ec.Pids())
	}
	cl, err := ec.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	d := &Etcd{Clients: []*clientv3.Client{cl}}
	defer d.Close()
	for _, w := range Workloads {
		if !Supports(d, w) {
			continue // the UTXO workloads: see TestUTXOWorkloadsNeedAUTXODriver
		}
		clients := 2
		if w == Handoff {
			clients = 4
		}
		res, err := Run(ctx, d, Options{Workload: w, Clients: clients, Ops: 20, Payload: 256})
		if err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		if res.Ops != 20 || res.Errors != 0 {
			t.Fatalf("%s: %d ops, %d errors (%s)", w, res.Ops, res.Errors, res.FirstErr)
		}
	}
	// The fenced update wrote the payload; the mutex keys are gone.
	if err := d.LockCycle(ctx, 0, "check", Payload(256)); err != nil {
		t.Fatal(err)
	}
	got, err := cl.Get(ctx, etcdPrefix+"data/check")
	if err != nil || len(got.Kvs) != 1 || len(got.Kvs[0].Value) != 256 {
		t.Fatalf("data after a lock cycle: %v %v", got, err)
	}
	locks, err := cl.Get(ctx, etcdPrefix+"lock/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || locks.Count != 0 {
		t.Fatalf("mutex keys left: %v %v", locks, err)
	}
	// A queue cycle leaves its queue empty.
	if err := d.QueueCycle(ctx, 0, "q", Payload(64)); err != nil {
		t.Fatal(err)
	}
	left, err := cl.Get(ctx, etcdPrefix+"queue/q/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || left.Count != 0 {
		t.Fatalf("queue entries left: %v %v", left, err)
	}
}
