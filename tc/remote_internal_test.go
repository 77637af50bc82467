package tc

import (
	"fmt"
	"net/http"
	"testing"
)

// The remote keeps a client for the endpoints it calls, but not for every
// endpoint it ever called: endpoints come and go with the registry (a
// server that moves leaves its old address behind), and the map stays
// within maxRemoteClients.
func TestTheRemoteKeepsABoundedNumberOfClients(t *testing.T) {
	h := &HTTPRemote{HTTP: http.DefaultClient}
	first, err := h.client("https://h0:9341")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := h.client("https://h0:9341"); again != first {
		t.Fatal("a second call to an endpoint made a new client")
	}
	for i := range 4 * maxRemoteClients {
		if _, err := h.client(fmt.Sprintf("https://h%d:9341", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.clients); n > maxRemoteClients {
		t.Fatalf("%d clients kept, want at most %d", n, maxRemoteClients)
	}
}
