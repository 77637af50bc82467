package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

// A subscription that ends (its context) after the server leased it a
// delivery it already read, but before that delivery reached fn, hands the
// delivery back rather than leaving it leased until its lease runs out.
func TestSubscriptionEndingHandsBackADeliveryItReadButDidNotHandOver(t *testing.T) {
	var mu sync.Mutex
	var nacked []wire.NackRequest
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/queue/subscribe":
			// Two deliveries in one write: both reach the client before
			// fn sees the first.
			w.Header().Set("Content-Type", "multipart/related; boundary=b1")
			_, _ = w.Write(deliveryBody(t, "b1", false, "one", "two"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/v1/queue/nack":
			var req wire.NackRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				t.Error(err)
			}
			mu.Lock()
			nacked = append(nacked, req)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"requeued":true}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	err = c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o", PageSize: 2}, func(d *Delivery) error {
		got = append(got, d.Message.MessageID)
		cancel() // the consumer stops after its first message
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "m0" {
		t.Fatalf("fn got %v", got)
	}
	if len(nacked) != 1 || nacked[0].MessageID != "m1" || nacked[0].Intent != wire.NackIntentDefer || nacked[0].LeaseID != "l" {
		t.Fatalf("handed back %+v, want only m1, deferred", nacked)
	}
}
