package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/xid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Etcd drives etcd through its Go client (go.etcd.io/etcd/client/v3) with
// the workloads expressed the way etcd's users write them; worker w talks
// to Clients[w % len(Clients)], so that load spreads over a cluster's
// members as with the raftlockd driver.
//
//   - lock: a concurrency.Mutex on the key (the worker's session: one etcd
//     lease per worker, kept alive for the run), a transaction writing the
//     payload guarded by Mutex.IsOwner (the fenced update), Unlock.
//   - handoff: every worker locks the same Mutex and unlocks it.
//   - xa-commit: Mutexes on both keys, one transaction writing both values
//     guarded by both IsOwner comparisons, Unlock of both.
//   - queue: put of a unique key under the queue's prefix (enqueue), get of
//     the oldest key under the prefix (dequeue), and a transaction deleting
//     it if unchanged (acknowledge: the message is taken once).
//   - public-read: a linearizable Get (etcd's default).
//   - put: a Put.
//
// It does not run utxo-spend and utxo-create: etcd has no UTXO records.
type Etcd struct {
	Clients []*clientv3.Client
	// SessionTTL is the TTL of the workers' sessions in seconds (default 30).
	SessionTTL int

	mu       sync.Mutex
	sessions map[int]*concurrency.Session
}

// Keys the etcd driver writes live under this prefix.
const etcdPrefix = "/raftlockd-bench/"

func (e *Etcd) c(worker int) *clientv3.Client { return e.Clients[worker%len(e.Clients)] }

// session returns worker's session, opening it (or a new one when the
// previous one expired) on first use.
func (e *Etcd) session(worker int) (*concurrency.Session, error) {
	e.mu.Lock()
	s := e.sessions[worker]
	e.mu.Unlock()
	if s != nil {
		select {
		case <-s.Done():
		default:
			return s, nil
		}
	}
	ttl := e.SessionTTL
	if ttl <= 0 {
		ttl = 30
	}
	s, err := concurrency.NewSession(e.c(worker), concurrency.WithTTL(ttl))
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	e.mu.Lock()
	if e.sessions == nil {
		e.sessions = map[int]*concurrency.Session{}
	}
	e.sessions[worker] = s
	e.mu.Unlock()
	return s, nil
}

// Close ends the workers' sessions (revoking their leases); it does not
// close the clients.
func (e *Etcd) Close() error {
	e.mu.Lock()
	sessions := e.sessions
	e.sessions = nil
	e.mu.Unlock()
	var errs []error
	for _, s := range sessions {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Name implements Driver.
func (e *Etcd) Name() string { return "etcd" }

// lock locks a Mutex on each key in turn.
func (e *Etcd) lock(ctx context.Context, worker int, keys ...string) ([]*concurrency.Mutex, error) {
	s, err := e.session(worker)
	if err != nil {
		return nil, err
	}
	var held []*concurrency.Mutex
	for _, k := range keys {
		m := concurrency.NewMutex(s, etcdPrefix+"lock/"+k)
		if err := m.Lock(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("lock: %w", err), e.unlock(ctx, held))
		}
		held = append(held, m)
	}
	return held, nil
}

func (e *Etcd) unlock(ctx context.Context, held []*concurrency.Mutex) error {
	var errs []error
	for _, m := range held {
		if err := m.Unlock(ctx); err != nil {
			errs = append(errs, fmt.Errorf("unlock: %w", err))
		}
	}
	return errors.Join(errs...)
}

// fencedWrite writes payload to each key in one transaction guarded by the
// ownership of every mutex in held.
func (e *Etcd) fencedWrite(ctx context.Context, worker int, held []*concurrency.Mutex, keys []string, payload []byte) error {
	var cmps []clientv3.Cmp
	for _, m := range held {
		cmps = append(cmps, m.IsOwner())
	}
	var ops []clientv3.Op
	for _, k := range keys {
		ops = append(ops, clientv3.OpPut(etcdPrefix+"data/"+k, string(payload)))
	}
	resp, err := e.c(worker).Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("txn: %w", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("txn: the lock was lost before the write")
	}
	return nil
}

// LockCycle implements Driver: Lock, a write guarded by IsOwner, Unlock.
func (e *Etcd) LockCycle(ctx context.Context, worker int, key string, payload []byte) error {
	held, err := e.lock(ctx, worker, key)
	if err != nil {
		return err
	}
	if err := e.fencedWrite(ctx, worker, held, []string{key}, payload); err != nil {
		return errors.Join(err, e.unlock(ctx, held))
	}
	return e.unlock(ctx, held)
}

// Handoff implements Driver: Lock of the shared Mutex (waiting behind the
// earlier contenders), Unlock.
func (e *Etcd) Handoff(ctx context.Context, worker int, key string) error {
	held, err := e.lock(ctx, worker, key)
	if err != nil {
		return err
	}
	return e.unlock(ctx, held)
}

// XACommit implements XADriver: both Mutexes, one transaction writing both
// keys guarded by both, Unlock of both.
func (e *Etcd) XACommit(ctx context.Context, worker int, keys [2]string, payload []byte) error {
	held, err := e.lock(ctx, worker, keys[0], keys[1])
	if err != nil {
		return err
	}
	if err := e.fencedWrite(ctx, worker, held, keys[:], payload); err != nil {
		return errors.Join(err, e.unlock(ctx, held))
	}
	return e.unlock(ctx, held)
}

// QueueCycle implements QueueDriver: put under the queue's prefix, get the
// oldest entry, delete it if unchanged. The consumer talks to another
// member than the producer, as with raftlockd.
func (e *Etcd) QueueCycle(ctx context.Context, worker int, queue string, payload []byte) error {
	prefix := etcdPrefix + "queue/" + queue + "/"
	if _, err := e.c(worker).Put(ctx, prefix+xid.New().String(), string(payload)); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	consumer := e.c(worker + 1)
	for {
		resp, err := consumer.Get(ctx, prefix, clientv3.WithFirstCreate()...)
		if err != nil {
			return fmt.Errorf("dequeue: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("dequeue: queue %s is empty", queue)
		}
		kv := resp.Kvs[0]
		del, err := consumer.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit()
		if err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		if del.Succeeded {
			return nil
		}
	}
}

// Seed implements ReadDriver: a Put.
func (e *Etcd) Seed(ctx context.Context, key string, payload []byte) error {
	if _, err := e.c(0).Put(ctx, etcdPrefix+"data/"+key, string(payload)); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	return nil
}

// PublicRead implements ReadDriver: a linearizable Get.
func (e *Etcd) PublicRead(ctx context.Context, worker int, key string) error {
	resp, err := e.c(worker).Get(ctx, etcdPrefix+"data/"+key)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("get %s: no value", key)
	}
	return nil
}

// Put implements PutDriver: a Put.
func (e *Etcd) Put(ctx context.Context, worker int, key string, payload []byte) error {
	if _, err := e.c(worker).Put(ctx, etcdPrefix+"data/"+key, string(payload)); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	return nil
}
