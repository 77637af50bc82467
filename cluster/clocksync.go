package cluster

import (
	"encoding/binary"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Command time is the members' median clock, not the leader's own.
//
// Lease expiries and decision deadlines are stored as absolute times on the
// replicated clock, which only moves forward. Were each leader to stamp
// commands with its own wall clock, a new leader whose clock runs ahead
// would cut that much off every lease at failover (and the clock would
// never come back), and one whose clock runs behind would hold the clock
// still, keeping leases that should have ended. So each node measures how
// far its peers' clocks are from its own, from the clock reading every
// gossip probe's acknowledgement carries, and corrects its clock by the
// median of those offsets (its own counting as zero). Every node thus
// follows the same timeline, the majority's, and one node's wrong clock
// moves nothing. The correction needs offsets from at least two peers: with
// fewer there is no majority to follow, and the node keeps the correction
// it last had (none, until it has measured two peers), so that a node left
// with one peer (a three-node cluster with one node down) does not fall
// back to its own clock.

const (
	clockSamples   = 8               // probes kept per peer; the fastest round trip's offset is used
	clockSampleAge = 5 * time.Minute // a peer not heard from for this long no longer counts
	clockWarnSkew  = time.Second     // a correction beyond this is logged as a warning
)

// clockSync estimates this node's clock offset from its gossip peers'. It
// is memberlist's PingDelegate.
type clockSync struct {
	clock  Clock // this node's own clock, uncorrected
	logger *slog.Logger
	offset atomic.Int64 // ns to add to clock: the median offset

	mu     sync.Mutex
	peers  map[string]*peerClock
	warned bool // the last correction logged was beyond clockWarnSkew
}

type peerClock struct {
	samples []clockSample // the latest clockSamples probes, oldest first
}

type clockSample struct {
	offset time.Duration // how far the peer's clock was ahead of ours
	rtt    time.Duration
	at     time.Time // our clock's monotonic reading when it arrived
}

func newClockSync(clock Clock, logger *slog.Logger) *clockSync {
	return &clockSync{clock: clock, logger: logger, peers: map[string]*peerClock{}}
}

// Now is this node's clock corrected to the members' median.
func (c *clockSync) Now() time.Time { return c.clock.Now().Add(c.Offset()) }

// Offset is how far the members' median clock is ahead of this node's.
func (c *clockSync) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// AckPayload implements memberlist.PingDelegate: this node's own clock
// reading, in Unix nanoseconds.
func (c *clockSync) AckPayload() []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(c.clock.Now().UnixNano()))
}

// NotifyPingComplete implements memberlist.PingDelegate. The peer read its
// clock while answering, taken to be half the round trip ago.
func (c *clockSync) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	if other == nil || len(payload) != 8 || rtt < 0 {
		return
	}
	now := c.clock.Now()
	peer := time.Unix(0, int64(binary.BigEndian.Uint64(payload))).Add(rtt / 2)
	c.add(other.Name, clockSample{offset: peer.Sub(now), rtt: rtt, at: time.Now()})
}

func (c *clockSync) add(name string, s clockSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[name]
	if p == nil {
		p = &peerClock{}
		c.peers[name] = p
	}
	// A probe's offset is right to within half its round trip. Older
	// samples the new one cannot agree with were taken before a clock (this
	// node's or the peer's) stepped: kept, a fast one among them would
	// outweigh every probe since.
	p.samples = slices.DeleteFunc(p.samples, func(o clockSample) bool {
		return (o.offset - s.offset).Abs() > (o.rtt+s.rtt)/2+5*time.Millisecond // and some drift
	})
	p.samples = append(p.samples, s)
	if len(p.samples) > clockSamples {
		p.samples = slices.Delete(p.samples, 0, len(p.samples)-clockSamples)
	}
	c.update(s.at)
}

// update recomputes the correction from every peer heard from lately.
func (c *clockSync) update(now time.Time) {
	offsets := []time.Duration{0}
	for name, p := range c.peers {
		best, ok := p.best(now)
		if !ok {
			delete(c.peers, name)
			continue
		}
		offsets = append(offsets, best)
	}
	if len(offsets) < 3 {
		return // no majority to follow: the last correction holds
	}
	slices.Sort(offsets)
	mid := len(offsets) / 2
	median := offsets[mid]
	if len(offsets)%2 == 0 {
		median = (offsets[mid-1] + offsets[mid]) / 2
	}
	c.offset.Store(int64(median))
	if far := median.Abs() > clockWarnSkew; far != c.warned {
		c.warned = far
		if far {
			c.logger.Warn("this node's clock is off from its peers'; commands and reads use the members' median clock",
				"offset", median.Round(time.Millisecond), "peers", len(offsets)-1)
		} else {
			c.logger.Info("this node's clock agrees with its peers' again", "offset", median.Round(time.Millisecond))
		}
	}
}

// best is the offset measured with the fastest round trip among the recent
// probes: the one least distorted by queueing on the way.
func (p *peerClock) best(now time.Time) (time.Duration, bool) {
	var best *clockSample
	for i := range p.samples {
		s := &p.samples[i]
		if now.Sub(s.at) <= clockSampleAge && (best == nil || s.rtt < best.rtt) {
			best = s
		}
	}
	if best == nil {
		return 0, false
	}
	return best.offset, true
}
