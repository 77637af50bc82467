package client

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Stale reads, cluster administration, backups, lockd's TC membership
// endpoints and the island's access lists (certificate denylist, trusted
// CAs).

// GetPublicStale reads the committed document of a key from the serving
// node's local state, without confirming with the leader: it may miss the
// latest writes, and it answers while the node is cut off from the leader.
func (c *Client) GetPublicStale(ctx context.Context, ns, key string) (*Document, error) {
	return c.get(ctx, url.Values{"namespace": {c.ns(ns)}, "key": {key}, "public": {"1"}, "stale": {"1"}}, nil)
}

// DescribeStale is Describe from the serving node's local state.
func (c *Client) DescribeStale(ctx context.Context, ns, key string) (*wire.DescribeResponse, error) {
	var out wire.DescribeResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/describe",
		query: url.Values{"namespace": {c.ns(ns)}, "key": {key}, "stale": {"1"}}, idempotent: true}, &out)
	return &out, err
}

// ClusterStatus returns the serving node's view of its Raft group.
func (c *Client) ClusterStatus(ctx context.Context) (*wire.ClusterStatusResponse, error) {
	var out wire.ClusterStatusResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/cluster/status", idempotent: true}, &out)
	return &out, err
}

// ClusterMembers lists the cluster's servers with each one's Raft progress.
func (c *Client) ClusterMembers(ctx context.Context) (*wire.ClusterMembersResponse, error) {
	var out wire.ClusterMembersResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/cluster/members", idempotent: true}, &out)
	return &out, err
}

// ClusterLeave makes the server in use (the first of the client's list,
// unless an earlier call moved on from it) leave the cluster; it shuts
// down after answering. The call is never passed on to another server:
// when that one cannot be reached, it fails rather than make another
// leave.
func (c *Client) ClusterLeave(ctx context.Context) (*wire.LeaveResponse, error) {
	var out wire.LeaveResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/cluster/leave", body: []byte("{}"), pinned: true}, &out)
	return &out, err
}

// RemovePeer takes server id out of the Raft configuration. When the
// request had to be resent and the resend finds id no member, an earlier
// attempt removed it: that is its answer.
func (c *Client) RemovePeer(ctx context.Context, id string) (*wire.RemovePeerResponse, error) {
	body, _ := json.Marshal(wire.RemovePeerRequest{ID: id})
	var out wire.RemovePeerResponse
	var resent bool
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/cluster/remove-peer", body: body, idempotent: true,
		resent: &resent}, &out)
	if err != nil && resent && errors.Is(err, errcode.NotFound) {
		return &wire.RemovePeerResponse{Removed: true, ID: id}, nil
	}
	return &out, err
}

// Progress is told how many bytes of a transfer have moved so far and the
// total (-1 when unknown). It is called from the transfer's goroutine.
type Progress func(done, total int64)

// SaveSnapshot writes a snapshot of the cluster's state (a raftlockd state
// file) to w and returns its size.
func (c *Client) SaveSnapshot(ctx context.Context, w io.Writer, progress Progress) (int64, error) {
	resp, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/cluster/snapshot", idempotent: true})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := resp.ContentLength
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), &counter{r: resp.Body, total: total, progress: progress})
	if err != nil {
		return n, fmt.Errorf("client: receive snapshot: %w", err)
	}
	if total >= 0 && n != total {
		return n, fmt.Errorf("client: snapshot ended after %d of %d bytes", n, total)
	}
	if want := strings.ToLower(resp.Header.Get(wire.HeaderSnapshotSHA256)); want != "" && hex.EncodeToString(h.Sum(nil)) != want {
		return n, fmt.Errorf("client: the snapshot received does not match the SHA-256 the server sent (%s)", want)
	}
	return n, nil
}

// RestoreSnapshot replaces the whole cluster's state with a snapshot of
// size bytes read from src (as SaveSnapshot wrote it). Only the leader
// restores; any other node forwards the upload to the leader itself, so
// any node serves a restore, and a server of the client's list that
// cannot be reached is passed over as for any call. A server that answers not_leader instead (one
// that does not forward) names the leader, and the upload goes there. Each
// attempt first asks with Expect: 100-continue, so the file is sent only to
// a node that accepts it. The upload carries src's SHA-256, so the server
// restores exactly what src holds or nothing.
func (c *Client) RestoreSnapshot(ctx context.Context, src io.ReadSeeker, size int64, progress Progress) (*wire.RestoreResponse, error) {
	sum, err := SHA256Of(src)
	if err != nil {
		return nil, fmt.Errorf("client: read snapshot: %w", err)
	}
	return c.RestoreSnapshotSHA256(ctx, src, size, sum, progress)
}

// RestoreSnapshotSHA256 is RestoreSnapshot for a caller that knows src's
// SHA-256 (hex) already, so that src is not read an extra time for it.
func (c *Client) RestoreSnapshotSHA256(ctx context.Context, src io.ReadSeeker, size int64, sum string, progress Progress) (*wire.RestoreResponse, error) {
	base := c.endpoint()
	deadline := time.Now().Add(c.retryFor)
	backoff := 50 * time.Millisecond
	hops := 0 // servers tried without a pause since the last one
	for redirects := 0; ; {
		out, err := c.restoreOnce(ctx, base, src, size, sum, progress)
		if err == nil {
			return out, nil
		}
		var e *Error
		if errors.As(err, &e) && e.Envelope.Code == errcode.NotLeader.Code && e.Envelope.LeaderEndpoint != "" && redirects < 5 {
			if next := strings.TrimRight(e.Envelope.LeaderEndpoint, "/"); next != base {
				base = next
				redirects++
				continue
			}
		}
		moved := c.passOn(base, err)
		if !retryable(err, false) {
			return nil, err
		}
		if moved {
			// As every call does, the upload moves on to the next server.
			base = c.endpoint()
			if unreachable(err) && hops < len(c.bases)-1 && ctx.Err() == nil {
				hops++
				continue
			}
		}
		hops = 0
		if time.Now().Add(backoff).After(deadline) {
			return nil, err
		}
		if err := pause(ctx, backoff, err); err != nil {
			return nil, err
		}
		backoff = min(backoff*2, time.Second)
	}
}

// SHA256Of returns the hex SHA-256 of everything src holds, read from its
// start.
func SHA256Of(src io.ReadSeeker) (string, error) {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (c *Client) restoreOnce(ctx context.Context, base string, src io.ReadSeeker, size int64, sum string, progress Progress) (*wire.RestoreResponse, error) {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("client: rewind snapshot: %w", err)
	}
	body := &counter{r: src, total: size, progress: progress}
	defer body.Close() // the transport may still hold it; src is rewound by the next attempt
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/cluster/snapshot", body)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Expect", "100-continue")
	req.Header.Set(wire.HeaderExpectedSHA256, sum)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: POST /v1/cluster/snapshot: %w", err)
	}
	if resp, err = checkStatus(resp); err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out wire.RestoreResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("client: decode restore response: %w", err)
	}
	return &out, nil
}

// counter reports progress as a transfer reads through it. Once closed it
// reads nothing more, so that its source can be reused.
type counter struct {
	mu       sync.Mutex
	r        io.Reader
	done     int64
	total    int64
	progress Progress
	closed   bool
}

func (c *counter) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errors.New("client: transfer abandoned")
	}
	n, err := c.r.Read(p)
	c.done += int64(n)
	if n > 0 && c.progress != nil {
		c.progress(c.done, c.total)
	}
	return n, err
}

func (c *counter) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

// TCLeader returns the leader as lockd's /v1/tc/leader reports it.
func (c *Client) TCLeader(ctx context.Context) (*wire.TCLeaderResponse, error) {
	var out wire.TCLeaderResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/tc/leader", idempotent: true}, &out)
	return &out, err
}

// TCList returns the API endpoints of the cluster's live members.
func (c *Client) TCList(ctx context.Context) (*wire.TCClusterListResponse, error) {
	var out wire.TCClusterListResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/tc/cluster/list", idempotent: true}, &out)
	return &out, err
}

// TCAnnounce checks that self is the endpoint of a member and returns the
// membership list with the membership's expiry.
func (c *Client) TCAnnounce(ctx context.Context, self string) (*wire.TCClusterAnnounceResponse, error) {
	body, _ := json.Marshal(wire.TCClusterAnnounceRequest{SelfEndpoint: self})
	var out wire.TCClusterAnnounceResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/tc/cluster/announce", body: body, idempotent: true}, &out)
	return &out, err
}

// TCLeave makes the member serving endpoint self leave the cluster (when
// self is empty, the server in use, as ClusterLeave: the call is then not
// passed on to another server) and returns the remaining members.
func (c *Client) TCLeave(ctx context.Context, self string) (*wire.TCClusterLeaveResponse, error) {
	body, _ := json.Marshal(wire.TCClusterLeaveRequest{SelfEndpoint: self})
	var out wire.TCClusterLeaveResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/tc/cluster/leave", body: body, pinned: self == ""}, &out)
	return &out, err
}

// Revoke puts the certificate with serial (hex) on the island's replicated
// denylist: from the moment a node has applied it, requests presenting
// that certificate fail with certificate_revoked. Revoking a serial twice
// changes nothing (Changed is false).
func (c *Client) Revoke(ctx context.Context, serial, reason string) (*wire.RevokeResponse, error) {
	body, _ := json.Marshal(wire.RevokeRequest{Serial: serial, Reason: reason})
	var out wire.RevokeResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/auth/revoke", body: body, idempotent: true}, &out)
	return &out, err
}

// Revocations lists the denylist.
func (c *Client) Revocations(ctx context.Context) (*wire.RevocationsResponse, error) {
	var out wire.RevocationsResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/auth/revoked", idempotent: true}, &out)
	return &out, err
}

// Trust adds the CA certificate ca to the island's trust list under name
// (default: its common name): servers of that CA may then call the
// island's coordinator and resource-manager endpoints, and its TC clients
// the coordinator's client endpoints. Only the certificate is sent.
func (c *Client) Trust(ctx context.Context, name string, ca *x509.Certificate) (*wire.TrustResponse, error) {
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	return c.changeTrust(ctx, wire.TrustRequest{Name: name, CertPEM: string(certPEM)})
}

// Untrust drops the CA with fingerprint (hex SHA-256 of its certificate)
// from the trust list.
func (c *Client) Untrust(ctx context.Context, fingerprint string) (*wire.TrustResponse, error) {
	return c.changeTrust(ctx, wire.TrustRequest{Fingerprint: fingerprint, Remove: true})
}

func (c *Client) changeTrust(ctx context.Context, req wire.TrustRequest) (*wire.TrustResponse, error) {
	body, _ := json.Marshal(req)
	var out wire.TrustResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/tc/trust", body: body, idempotent: true}, &out)
	return &out, err
}

// TrustedCAs lists the trust list.
func (c *Client) TrustedCAs(ctx context.Context) (*wire.TrustListResponse, error) {
	var out wire.TrustListResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/tc/trust", idempotent: true}, &out)
	return &out, err
}
