package relay

// The socket to Relay: connect, answer, keep alive, reconnect; on goroutines of its own.
//
// Liveness is this client's own: a ping every PingInterval (20 s) whose pong must come within PongTimeout (15 s),
// else the socket is dropped and another opened, through the load balancer, to whichever gateway is alive.
// (v1.6.0's client extended a 30 s read deadline on pongs only, so it noticed a frozen gateway up to 30 s after the
// freeze.) A goroutine reads the socket all the time, so Relay's pings are answered and its pongs seen as they
// arrive, whatever request is being worked on.
//
// Requests are answered one at a time, in order, as every SDK answers them; a retention round runs on its own
// goroutine. A connection that fails to open, or is lost, is tried again after Backoff: 1 s, doubling to 30 s,
// jittered, and back to 1 s once a connection has been answered on.
//
// The key is the last segment of the URL (the protocol puts it there); it is never logged: log lines name the URL
// with the key replaced, and errors that quote the URL have it taken out.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Timing of the connection.
const (
	PingInterval = 20 * time.Second
	PongTimeout  = 15 * time.Second
	OpenTimeout  = 5 * time.Second  // the handshake, as dbos 3.2.0 allows it
	WriteTimeout = 10 * time.Second // one reply or ping
	CloseTimeout = 2 * time.Second  // a frozen gateway never answers the close: it is not waited for long
)

// pongOverdue is the reason of the close frame sent when a pong is overdue.
const pongOverdue = "pong timeout"

// Backoff is the delays between connection attempts: Initial doubling to Cap, each drawn from the upper
// 1-Jitter .. 1 of its step (never above Cap), so a fleet that lost its gateway together does not come back in one
// wave.
type Backoff struct {
	Initial, Cap time.Duration
	Jitter       float64
	Rand         *rand.Rand // nil: a generator of its own

	mu       sync.Mutex
	attempts int
}

// NewBackoff is 1 s doubling to 30 s, jittered by a fifth.
func NewBackoff() *Backoff { return &Backoff{Initial: time.Second, Cap: 30 * time.Second, Jitter: 0.2} }

// Next is the delay before the next attempt.
func (b *Backoff) Next() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Rand == nil {
		b.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	step := b.Cap
	if shift := min(b.attempts, 30); b.Initial<<shift < b.Cap && b.Initial<<shift > 0 {
		step = b.Initial << shift
	}
	b.attempts++
	return time.Duration(float64(step) * (1 - b.Jitter*b.Rand.Float64()))
}

// Reset starts the delays again from Initial.
func (b *Backoff) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.attempts = 0
}

// Attempts is how many delays were drawn since the last Reset.
func (b *Backoff) Attempts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempts
}

// websocketURL is {base}/websocket/{app}/{key}: where every SDK's conductor client connects.
func websocketURL(base, app, key string) string {
	return strings.TrimRight(base, "/") + "/websocket/" + url.PathEscape(app) + "/" + url.PathEscape(key)
}

// refused is a handshake Relay answered with an HTTP status other than 101.
type refused struct{ status int }

func (e *refused) Error() string { return fmt.Sprintf("HTTP %d", e.status) }

// dropped is a socket this side gave up on (its pong overdue, a ping that could not be written).
type dropped struct{ reason string }

func (e *dropped) Error() string { return e.reason }

// session is one open socket.
type session struct {
	conn      *websocket.Conn
	closing   chan struct{} // closed once the socket is being closed, by either side's wish
	closeOnce sync.Once
	failure   string // why this side dropped it, when it did
}

// end closes the socket: with a close frame (code, reason) when code is not 0, then at once (abort) or once the
// peer has answered the close (the reader then ends; Close bounds the wait).
func (s *session) end(code int, reason string, abort bool) {
	s.closeOnce.Do(func() {
		s.failure = reason
		close(s.closing)
		if code != 0 {
			_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason),
				time.Now().Add(CloseTimeout))
		}
		if abort {
			_ = s.conn.Close()
		}
	})
}

// connection holds the socket, from start until close.
type connection struct {
	url, shownURL string
	secrets       []string // the key as it may appear in an error's text
	operations    map[string]Operation
	metadataOnly  bool
	pingInterval  time.Duration
	pongTimeout   time.Duration
	backoff       *Backoff
	log           *slog.Logger

	stopping    chan struct{}
	stopOnce    sync.Once
	done        chan struct{}
	connections atomic.Int64 // sockets opened so far (a reconnect makes it 2)

	mu        sync.Mutex
	current   *session
	connected chan struct{} // closed while a socket is open and has been answered on
	isUp      bool
}

func newConnection(base, app, key string, ops map[string]Operation, metadataOnly bool, ping, pong time.Duration,
	backoff *Backoff, log *slog.Logger) *connection {
	return &connection{
		url: websocketURL(base, app, key), shownURL: strings.TrimRight(base, "/") + "/websocket/" +
			url.PathEscape(app) + "/***",
		secrets:    []string{key, url.PathEscape(key), url.QueryEscape(key)},
		operations: ops, metadataOnly: metadataOnly, pingInterval: ping, pongTimeout: pong, backoff: backoff,
		log: log, stopping: make(chan struct{}), done: make(chan struct{}), connected: make(chan struct{}),
	}
}

func (c *connection) start() { go c.run() }

func (c *connection) isStopping() bool {
	select {
	case <-c.stopping:
		return true
	default:
		return false
	}
}

func (c *connection) redact(s string) string {
	for _, secret := range c.secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "***")
		}
	}
	return s
}

func (c *connection) setConnected(up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if up && !c.isUp {
		close(c.connected)
	} else if !up && c.isUp {
		c.connected = make(chan struct{})
	}
	c.isUp = up
}

// waitConnected waits until a socket is open and answered on, at most timeout.
func (c *connection) waitConnected(timeout time.Duration) bool {
	c.mu.Lock()
	ch := c.connected
	c.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (c *connection) up() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.isUp
}

// close closes the socket cleanly and ends the goroutines, within timeout; idempotent.
func (c *connection) close(timeout time.Duration) {
	c.stopOnce.Do(func() { close(c.stopping) })
	c.mu.Lock()
	current := c.current
	c.mu.Unlock()
	if current != nil {
		current.end(websocket.CloseNormalClosure, "", false)
	}
	select {
	case <-c.done:
		return
	case <-time.After(min(CloseTimeout, timeout)):
	}
	if current != nil { // the peer did not answer the close: its loss
		_ = current.conn.Close()
	}
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.log.Warn("relay-dbos: the connection did not end within the close timeout")
	}
}

// -- the goroutines -----------------------------------------------------------------------------------------------

func (c *connection) run() {
	defer close(c.done)
	for !c.isStopping() {
		err := c.serve()
		c.setConnected(false)
		if c.isStopping() {
			break
		}
		var closeErr *websocket.CloseError
		var refusal *refused
		var drop *dropped
		switch {
		case errors.As(err, &drop) && drop.reason == pongOverdue: // said when it was noticed
		case errors.As(err, &drop):
			c.log.Warn(fmt.Sprintf("relay-dbos: connection to Relay dropped (%s); reconnecting", drop.reason))
		case errors.As(err, &refusal):
			c.log.Warn(fmt.Sprintf("relay-dbos: Relay refused the connection to %s: HTTP %d", c.shownURL,
				refusal.status))
		case errors.As(err, &closeErr):
			reason := fmt.Sprintf("code %d", closeErr.Code)
			if closeErr.Text != "" {
				reason += ": " + truncate(closeErr.Text, 100)
			}
			c.log.Warn(fmt.Sprintf("relay-dbos: connection to Relay lost (%s); reconnecting", reason))
		case err != nil:
			c.log.Warn(fmt.Sprintf("relay-dbos: cannot reach Relay at %s (%s); reconnecting", c.shownURL,
				truncate(c.redact(err.Error()), 300)))
		}
		select {
		case <-c.stopping:
		case <-time.After(c.backoff.Next()):
		}
	}
	c.log.Info("relay-dbos: connection to Relay closed")
}

// dial opens a socket, or gives up when close is called meanwhile.
func (c *connection) dial() (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), OpenTimeout)
	defer cancel()
	go func() {
		select {
		case <-c.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	dialer := websocket.Dialer{HandshakeTimeout: OpenTimeout, Proxy: http.ProxyFromEnvironment}
	conn, response, err := dialer.DialContext(ctx, c.url, nil)
	if errors.Is(err, websocket.ErrBadHandshake) && response != nil {
		return nil, &refused{status: response.StatusCode}
	}
	return conn, err
}

// serve opens one socket and answers on it until it is lost or closed; why it ended.
func (c *connection) serve() error {
	conn, err := c.dial()
	if err != nil {
		return err
	}
	c.connections.Add(1)
	s := &session{conn: conn, closing: make(chan struct{})}
	c.mu.Lock()
	c.current = s
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.current = nil
		c.mu.Unlock()
		_ = conn.Close()
	}()
	if c.isStopping() { // close came while the handshake ran
		s.end(websocket.CloseNormalClosure, "", true)
		return nil
	}
	pongs := make(chan struct{}, 1)
	conn.SetPongHandler(func(string) error {
		select {
		case pongs <- struct{}{}:
		default:
		}
		return nil
	})
	frames := make(chan []byte, 64)
	var workers sync.WaitGroup
	workers.Add(2)
	go func() { defer workers.Done(); c.keepalive(s, pongs) }()
	go func() { defer workers.Done(); c.answer(s, frames) }()
	var readErr error
	for readErr == nil {
		var frame []byte
		if _, frame, readErr = conn.ReadMessage(); readErr == nil {
			select {
			case frames <- frame:
			case <-s.closing:
			}
		}
	}
	s.end(0, "", true) // before the last frames are handed over: a request whose reply cannot go out is not acted on
	close(frames)
	workers.Wait()
	if s.failure != "" {
		return &dropped{reason: s.failure}
	}
	return readErr
}

// answer replies to the frames in order, one at a time.
func (c *connection) answer(s *session, frames <-chan []byte) {
	for frame := range frames {
		select {
		case <-s.closing: // no reply could go out: the request is not acted on
			continue
		default:
		}
		reply := c.handle(frame)
		_ = s.conn.SetWriteDeadline(time.Now().Add(WriteTimeout))
		if err := s.conn.WriteMessage(websocket.TextMessage, reply); err != nil {
			s.end(0, "", true)
			continue
		}
		if !c.up() {
			c.setConnected(true)
			c.backoff.Reset()
			c.log.Info("relay-dbos: connected to Relay at " + c.shownURL)
		}
	}
}

// handle is Handle, and a reply whatever happens in it: nothing in a request takes the application down.
func (c *connection) handle(frame []byte) (reply []byte) {
	defer func() {
		if recovered := recover(); recovered != nil {
			c.log.Error("relay-dbos: a request could not be answered", "panic", fmt.Sprint(recovered))
			request, _ := Decode(frame)
			reply = Encode(request.Kind, request.RequestID, Fields{}, text(fmt.Sprintf("panic: %v", recovered)), false)
		}
	}()
	return Handle(frame, c.operations, c.metadataOnly, c.log)
}

// keepalive pings every pingInterval; a pong later than pongTimeout drops the socket (the reader then reconnects).
// It ends with its socket.
func (c *connection) keepalive(s *session, pongs chan struct{}) {
	for {
		select {
		case <-s.closing:
			return
		case <-time.After(c.pingInterval):
		}
		select { // a pong that came unasked, or late, answers nothing now
		case <-pongs:
		default:
		}
		if err := s.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(WriteTimeout)); err != nil {
			s.end(0, "ping failed", true)
			return
		}
		timer := time.NewTimer(c.pongTimeout)
		select {
		case <-pongs:
			timer.Stop()
		case <-s.closing:
			timer.Stop()
			return
		case <-timer.C:
			if c.isStopping() {
				return
			}
			c.log.Warn(fmt.Sprintf("relay-dbos: no pong from Relay within %g s; reconnecting",
				c.pongTimeout.Seconds()))
			s.end(websocket.CloseInternalServerErr, pongOverdue, true)
			return
		}
	}
}
