package api

import (
	"context"
	"crypto/x509"
	"net/http"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/tc"
)

// Authenticator verifies the certificate chain a caller presented; foreign
// allows chains to a CA on the island's trust list.
type Authenticator interface {
	Check(chain []*x509.Certificate, foreign bool, now time.Time) (auth.Identity, error)
}

// class is who may call an endpoint.
type class int

const (
	classOpen     class = iota // probes and unknown paths: no certificate
	classClient                // leases, state, queues, UTXOs: a client certificate covering the namespace, or a server's
	classTCClient              // the coordinator's client face: a TC client or server certificate, own or trusted CA
	classTCServer              // islands calling each other: a server certificate, own or trusted CA
	classAdmin                 // operating the island: a server certificate of the island's own CA
	classAny                   // any certificate of the island's own CA (metrics)
)

// endpointClass is the one table saying who may call what. Endpoints not
// listed are administrative.
var endpointClass = map[string]class{
	"/healthz": classOpen, "/readyz": classOpen, "other": classOpen,

	"/v1/acquire": classClient, "/v1/keepalive": classClient, "/v1/release": classClient,
	"/v1/get": classClient, "/v1/update": classClient, "/v1/remove": classClient, "/v1/describe": classClient,
	"/v1/queue/enqueue": classClient, "/v1/queue/dequeue": classClient, "/v1/queue/dequeueWithState": classClient,
	"/v1/queue/subscribe": classClient, "/v1/queue/subscribeWithState": classClient, "/v1/queue/ack": classClient,
	"/v1/queue/nack": classClient, "/v1/queue/extend": classClient, "/v1/queue/stats": classClient,
	"/v1/utxo/create": classClient, "/v1/utxo/spend": classClient, "/v1/utxo/unspend": classClient,
	"/v1/utxo/freeze": classClient, "/v1/utxo/unfreeze": classClient, "/v1/utxo/reassign": classClient,
	"/v1/utxo/conflicting": classClient, "/v1/utxo/locked": classClient, "/v1/utxo/preserve": classClient,
	"/v1/utxo/mined": classClient, "/v1/utxo/longest-chain": classClient, "/v1/utxo/height": classClient,
	"/v1/utxo/tx": classClient, "/v1/utxo/blocks/apply": classClient, "/v1/utxo/blocks/rollback": classClient,
	"/v1/utxo/prune": classClient, "/v1/utxo/status": classClient, "/ui/status": classOpen,

	"/v1/tc/leader": classTCClient, "/v1/tc/cluster/list": classTCClient, "/v1/tc/rm/list": classTCClient,
	"/v1/txn/decide": classTCClient, "/v1/txn/replay": classTCClient, "/v1/txn/status": classTCClient,

	// A leave shuts a member down, as /v1/cluster/leave does: only the
	// island's own servers may ask for it (it is administrative).
	"/v1/tc/cluster/announce": classTCServer, "/v1/tc/cluster/leave": classAdmin,
	"/v1/tc/rm/register": classTCServer, "/v1/tc/rm/unregister": classTCServer,
	"/v1/txn/prepare": classTCServer, "/v1/txn/commit": classTCServer, "/v1/txn/rollback": classTCServer,

	"/metrics": classAny,
}

func classOf(endpoint string) class {
	if c, ok := endpointClass[endpoint]; ok {
		return c
	}
	return classAdmin
}

type identityKey struct{}

// identityOf is the verified caller of a request; nil when the endpoint
// needs no certificate or authentication is off.
func identityOf(ctx context.Context) *auth.Identity {
	id, _ := ctx.Value(identityKey{}).(*auth.Identity)
	return id
}

// authenticate verifies the caller of endpoint and returns the request
// carrying its identity.
func (h *handler) authenticate(r *http.Request, endpoint string) (*http.Request, error) {
	c := classOf(endpoint)
	if h.Auth == nil || c == classOpen || h.TCAuthDisabled && (c == classTCClient || c == classTCServer) {
		return r, nil
	}
	var chain []*x509.Certificate
	if r.TLS != nil {
		chain = r.TLS.PeerCertificates
	}
	id, err := h.Auth.Check(chain, c == classTCClient || c == classTCServer, time.Now())
	if err != nil {
		return r, err
	}
	var ok bool
	switch c {
	case classClient:
		ok = id.Role == auth.RoleClient || id.Role == auth.RoleServer
	case classTCClient:
		ok = id.Role == auth.RoleTCClient || id.Role == auth.RoleServer
	case classTCServer, classAdmin:
		ok = id.Role == auth.RoleServer
	case classAny:
		ok = true
	}
	if !ok {
		return r, errcode.RoleForbidden.With("a %s certificate may not call %s", id.Role, endpoint)
	}
	return r.WithContext(context.WithValue(r.Context(), identityKey{}, &id)), nil
}

// permit checks that the caller may read (or change) namespace ns. A
// namespace that does not normalise is left for the service to reject.
func permit(ctx context.Context, ns string, write bool) error {
	id := identityOf(ctx)
	if id == nil {
		return nil
	}
	norm, err := rm.Namespace(ns)
	if err != nil {
		return nil //nolint:nilerr // the service answers invalid_namespace
	}
	if !id.Allows(norm, write) {
		verb := "read"
		if write {
			verb = "write"
		}
		return errcode.NamespaceForbidden.With("certificate %q may not %s namespace %q", id.Name, verb, norm)
	}
	return nil
}

// The services as a certificate-holding caller sees them: every call is
// checked against the caller's namespace permissions first.
type guardedLeases struct{ Leases }

func (g guardedLeases) Acquire(ctx context.Context, p rm.AcquireParams) (*fsm.LeaseInfo, error) {
	if err := permit(ctx, p.Namespace, true); err != nil {
		return nil, err
	}
	return g.Leases.Acquire(ctx, p)
}

func (g guardedLeases) KeepAlive(ctx context.Context, ref rm.LeaseRef, ttl int64) (*fsm.LeaseInfo, error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return nil, err
	}
	return g.Leases.KeepAlive(ctx, ref, ttl)
}

func (g guardedLeases) Update(ctx context.Context, ref rm.LeaseRef, cond rm.Conditions, body rm.Body) (*fsm.WriteResult, error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return nil, err
	}
	return g.Leases.Update(ctx, ref, cond, body)
}

func (g guardedLeases) Remove(ctx context.Context, ref rm.LeaseRef, cond rm.Conditions) (*fsm.WriteResult, error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return nil, err
	}
	return g.Leases.Remove(ctx, ref, cond)
}

func (g guardedLeases) Get(ctx context.Context, ref rm.LeaseRef, public bool, c rm.Consistency) (fsm.Doc, error) {
	if err := permit(ctx, ref.Namespace, false); err != nil {
		return fsm.Doc{}, err
	}
	return g.Leases.Get(ctx, ref, public, c)
}

func (g guardedLeases) Describe(ctx context.Context, ns, key string, c rm.Consistency) (rm.Description, error) {
	if err := permit(ctx, ns, false); err != nil {
		return rm.Description{}, err
	}
	return g.Leases.Describe(ctx, ns, key, c)
}

type guardedReleaser struct{ Releaser }

func (g guardedReleaser) Release(ctx context.Context, ref rm.LeaseRef, rollback bool) (out tc.Outcome, err error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return out, err
	}
	return g.Releaser.Release(ctx, ref, rollback)
}

type guardedQueues struct{ Queues }

func (g guardedQueues) Enqueue(ctx context.Context, p rm.EnqueueParams) (*fsm.MessageInfo, error) {
	if err := permit(ctx, p.Namespace, true); err != nil {
		return nil, err
	}
	return g.Queues.Enqueue(ctx, p)
}

func (g guardedQueues) Dequeue(ctx context.Context, p rm.DequeueParams) (*rm.Delivery, error) {
	if err := permit(ctx, p.Namespace, true); err != nil {
		return nil, err
	}
	return g.Queues.Dequeue(ctx, p)
}

func (g guardedQueues) Ack(ctx context.Context, ref rm.MessageRef) error {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return err
	}
	return g.Queues.Ack(ctx, ref)
}

func (g guardedQueues) Nack(ctx context.Context, ref rm.MessageRef, p rm.NackParams) (*fsm.QueueResult, error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return nil, err
	}
	return g.Queues.Nack(ctx, ref, p)
}

func (g guardedQueues) Extend(ctx context.Context, ref rm.MessageRef, by int64) (*fsm.MessageInfo, error) {
	if err := permit(ctx, ref.Namespace, true); err != nil {
		return nil, err
	}
	return g.Queues.Extend(ctx, ref, by)
}

func (g guardedQueues) Stats(ctx context.Context, ns, queue string, c rm.Consistency) (fsm.QueueStats, error) {
	if err := permit(ctx, ns, false); err != nil {
		return fsm.QueueStats{}, err
	}
	return g.Queues.Stats(ctx, ns, queue, c)
}
