package tc

import (
	"context"
	"net/http"
	"sync"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// HTTPRemote reaches other islands' HTTP APIs with the Go client, one
// client per endpoint over a shared transport. Retries are the
// coordinator's business, so the clients make a single attempt. It keeps
// at most maxRemoteClients clients: endpoints come and go with the
// registry, and a client is cheap to make again.
type HTTPRemote struct {
	HTTP *http.Client // nil: a default client

	mu      sync.Mutex
	clients map[string]*client.Client
}

// maxRemoteClients bounds the clients an HTTPRemote keeps.
const maxRemoteClients = 256

func (h *HTTPRemote) client(endpoint string) (*client.Client, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.clients[endpoint]; ok {
		return c, nil
	}
	var opts []client.Option
	if h.HTTP != nil {
		opts = append(opts, client.WithHTTPClient(h.HTTP))
	}
	c, err := client.New(endpoint, append(opts, client.WithRetry(0))...)
	if err != nil {
		return nil, err
	}
	if h.clients == nil {
		h.clients = map[string]*client.Client{}
	}
	for ep := range h.clients {
		if len(h.clients) < maxRemoteClients {
			break
		}
		delete(h.clients, ep)
	}
	h.clients[endpoint] = c
	return c, nil
}

func call[T any](h *HTTPRemote, endpoint string, fn func(c *client.Client) (*T, error)) (T, error) {
	var zero T
	c, err := h.client(endpoint)
	if err != nil {
		return zero, err
	}
	out, err := fn(c)
	if err != nil {
		return zero, err
	}
	return *out, nil
}

// Prepare implements Remote.
func (h *HTTPRemote) Prepare(ctx context.Context, endpoint string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return call(h, endpoint, func(c *client.Client) (*wire.TxnDecisionResponse, error) { return c.TxnPrepare(ctx, req) })
}

// Apply implements Remote.
func (h *HTTPRemote) Apply(ctx context.Context, endpoint string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return call(h, endpoint, func(c *client.Client) (*wire.TxnDecisionResponse, error) { return c.TxnApply(ctx, req) })
}

// Decide implements Remote.
func (h *HTTPRemote) Decide(ctx context.Context, endpoint, home string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return call(h, endpoint, func(c *client.Client) (*wire.TxnDecisionResponse, error) { return c.TxnDecideAt(ctx, req, home) })
}

// Replay implements Remote.
func (h *HTTPRemote) Replay(ctx context.Context, endpoint, home, txnID string) (wire.TxnReplayResponse, error) {
	return call(h, endpoint, func(c *client.Client) (*wire.TxnReplayResponse, error) { return c.TxnReplayAt(ctx, txnID, home) })
}

// Register implements Remote.
func (h *HTTPRemote) Register(ctx context.Context, endpoint string, req wire.TCRMRegisterRequest, remove bool) (wire.TCRMRegisterResponse, error) {
	return call(h, endpoint, func(c *client.Client) (*wire.TCRMRegisterResponse, error) {
		return c.RMRegister(ctx, req, remove)
	})
}
