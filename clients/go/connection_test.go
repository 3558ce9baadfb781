package relay

// The socket (connection, Connect) against a fake Relay: a WebSocket server of the test's that speaks first, sends
// requests and keeps the replies. It answers the server's first request, every message type over the socket,
// reconnects when the socket is lost or stops answering pings, closes cleanly, and never logs its key.
//
// The server answers pings as it reads them, so a frozen gateway is a TCP proxy of the test's that stops forwarding
// bytes (proxy.freeze): the server's pongs no longer reach the client, as with a gateway process that was stopped
// while its sockets stay open.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

const (
	testKey    = "dbos_s3cr3t-key/with+odd chars"
	quotedKey  = "dbos_s3cr3t-key%2Fwith+odd%20chars"
	secretPart = "s3cr3t"
)

// -- a logger that keeps its records ------------------------------------------------------------------------------

type logged struct {
	at      time.Time
	level   slog.Level
	message string
	text    string // the message with every attribute
}

type logs struct {
	mu      sync.Mutex
	records []logged
}

type captureHandler struct {
	into  *logs
	attrs []slog.Attr
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	text := r.Message
	for _, a := range h.attrs {
		text += " " + a.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.String()
		return true
	})
	h.into.mu.Lock()
	defer h.into.mu.Unlock()
	h.into.records = append(h.into.records, logged{at: r.Time, level: r.Level, message: r.Message, text: text})
	return nil
}

func (h *captureHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &captureHandler{into: h.into, attrs: append(append([]slog.Attr{}, h.attrs...), attrs...)}
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

// testLogger logs into `into` (nil: nowhere).
func testLogger(t *testing.T, into *logs) *slog.Logger {
	if into == nil {
		into = &logs{}
	}
	return slog.New(&captureHandler{into: into})
}

func (l *logs) all() []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logged{}, l.records...)
}

func (l *logs) matching(level slog.Level, part string) []logged {
	var out []logged
	for _, r := range l.all() {
		if r.level == level && strings.Contains(r.message, part) {
			out = append(out, r)
		}
	}
	return out
}

// -- a fake Relay ---------------------------------------------------------------------------------------------------

type closeSeen struct {
	code int
	text string
}

// relayStub is a WebSocket server playing Relay: each connection gets executor_info first and its reply is kept;
// then(conn, n) decides what happens next on the n-th connection (by default: read until the client closes).
type relayStub struct {
	t       *testing.T
	server  *httptest.Server
	refuse  int // an HTTP status to answer every upgrade with, 0 for none
	then    func(conn *websocket.Conn, n int)
	replies chan m

	mu          sync.Mutex
	connections int
	paths       []string // the raw path of every upgrade request
	closes      []closeSeen
	conns       []*websocket.Conn
}

func newRelayStub(t *testing.T, refuse int) *relayStub {
	s := &relayStub{t: t, refuse: refuse, replies: make(chan m, 100)}
	s.then = s.waitForClose
	s.server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(func() {
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.server.Close()
	})
	return s
}

func (s *relayStub) port() string { return s.server.Listener.Addr().(*net.TCPAddr).AddrPort().String() }

func (s *relayStub) handle(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.paths = append(s.paths, r.URL.EscapedPath())
	s.mu.Unlock()
	if s.refuse != 0 {
		http.Error(w, "no", s.refuse)
		return
	}
	conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.connections++
	n := s.connections
	s.conns = append(s.conns, conn)
	s.mu.Unlock()
	reply, err := s.request(conn, m{"type": "executor_info"})
	if err != nil {
		return
	}
	s.replies <- reply
	s.then(conn, n)
}

// request sends a request (its request_id added) and reads the reply, which must match it.
func (s *relayStub) request(conn *websocket.Conn, request m) (m, error) {
	requestID := uuid4()
	request["request_id"] = requestID
	if err := conn.WriteJSON(request); err != nil {
		return nil, err
	}
	return s.read(conn, requestID)
}

func (s *relayStub) read(conn *websocket.Conn, requestID string) (m, error) {
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var reply m
	if err := conn.ReadJSON(&reply); err != nil {
		return nil, err
	}
	if reply["request_id"] != requestID {
		return nil, fmt.Errorf("reply %v to request %s", reply, requestID)
	}
	return reply, nil
}

func (s *relayStub) waitForClose(conn *websocket.Conn, _ int) {
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			var closed *websocket.CloseError
			if errors.As(err, &closed) {
				s.mu.Lock()
				s.closes = append(s.closes, closeSeen{closed.Code, closed.Text})
				s.mu.Unlock()
			}
			return
		}
	}
}

func (s *relayStub) reply() m {
	s.t.Helper()
	select {
	case reply := <-s.replies:
		return reply
	case <-time.After(10 * time.Second):
		s.t.Fatal("no executor_info reply within 10 s")
		return nil
	}
}

func (s *relayStub) pathList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string{}, s.paths...)
}

func (s *relayStub) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connections
}

// -- a TCP proxy that can freeze ------------------------------------------------------------------------------------

type proxy struct {
	listener net.Listener
	target   string
	mu       sync.Mutex
	links    []net.Conn
	frozen   map[net.Conn]bool // the client ends of frozen links
	wg       sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{listener: listener, target: target, frozen: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) address() string { return p.listener.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		upstream, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.links = append(p.links, client, upstream)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(client, client, upstream)
		go p.pump(client, upstream, client)
	}
}

// pump copies from source to target while the link (named by its client end) is not frozen; what arrives on a
// frozen link is read and dropped. One side gone, the link is.
func (p *proxy) pump(link, source, target net.Conn) {
	defer p.wg.Done()
	buffer := make([]byte, 65536)
	for {
		n, err := source.Read(buffer)
		if n > 0 {
			p.mu.Lock()
			frozen := p.frozen[link]
			p.mu.Unlock()
			if !frozen {
				_, _ = target.Write(buffer[:n])
			}
		}
		if err != nil {
			_ = source.Close()
			_ = target.Close()
			return
		}
	}
}

// freeze stops forwarding on the links open now; new links are forwarded.
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.links); i += 2 {
		p.frozen[p.links[i]] = true
	}
}

func (p *proxy) close() {
	_ = p.listener.Close()
	p.mu.Lock()
	for _, c := range p.links {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// -- the connection under test --------------------------------------------------------------------------------------

func fastBackoff() *Backoff {
	return &Backoff{Initial: 50 * time.Millisecond, Cap: 200 * time.Millisecond, Jitter: 0.2,
		Rand: rand.New(rand.NewPCG(1, 2))}
}

// startConnection starts a connection on the real operations table; it is closed at the test's end.
func startConnection(t *testing.T, base string, log *logs, ping, pong time.Duration, backoff *Backoff) *connection {
	if backoff == nil {
		backoff = fastBackoff()
	}
	ops := &operations{ctx: env.ctx, sdkVersion: "v1.9.0", log: testLogger(t, log),
		retention: &retention{ctx: env.ctx, log: testLogger(t, log), stopped: func() bool { return false }}}
	c := newConnection(base, testApp, testKey, ops.table(), false, ping, pong, backoff, testLogger(t, log))
	c.start()
	t.Cleanup(func() {
		c.close(5 * time.Second)
		select {
		case <-c.done:
		default:
			t.Error("the connection's goroutines did not end")
		}
	})
	return c
}

func TestTheServerSpeaksFirstAndGetsExecutorInfo(t *testing.T) {
	stub := newRelayStub(t, 0)
	c := startConnection(t, "ws://"+stub.port()+"/", nil, PingInterval, PongTimeout, nil)
	reply := stub.reply()
	if reply["type"] != "executor_info" || reply["executor_id"] != env.executorID || reply["language"] != "go" ||
		reply["error_message"] != nil {
		t.Fatalf("reply %v", reply)
	}
	// Where every SDK connects: the key in the path, every character of it kept.
	paths := stub.pathList()
	if want := "/websocket/" + testApp + "/" + quotedKey; len(paths) != 1 || paths[0] != want {
		t.Fatalf("paths %v, want %s", paths, want)
	}
	if unquoted, _ := url.PathUnescape(paths[0]); !strings.HasSuffix(unquoted, "/"+testKey) {
		t.Fatalf("the key came as %s", unquoted)
	}
	if !c.waitConnected(5*time.Second) || c.connections.Load() != 1 {
		t.Fatal("not connected")
	}
}

func TestEveryMessageTypeIsAnsweredOverTheSocket(t *testing.T) {
	stub := newRelayStub(t, 0)
	results := make(chan error, 1)
	stub.then = func(conn *websocket.Conn, n int) {
		results <- func() error {
			for _, kind := range allTypes {
				reply, err := stub.request(conn, m{"type": kind})
				if err != nil {
					return err
				}
				if reply["type"] != kind {
					return fmt.Errorf("%s answered as %v", kind, reply["type"])
				}
				if _, ok := reply["error_message"]; !ok {
					return fmt.Errorf("%s: no error_message in %v", kind, reply)
				}
			}
			// A malformed frame and an unknown type are answered, and the socket stays up.
			if err := conn.WriteMessage(websocket.TextMessage, []byte("not json")); err != nil {
				return err
			}
			if reply, err := stub.read(conn, ""); err != nil || !strings.HasPrefix(reply["error_message"].(string), "malformed") {
				return fmt.Errorf("malformed frame: %v %v", reply, err)
			}
			if reply, err := stub.request(conn, m{"type": "no_such_type"}); err != nil || reply["error_message"] != UnknownType {
				return fmt.Errorf("unknown type: %v %v", reply, err)
			}
			reply, err := stub.request(conn, m{"type": "get_metrics"})
			if err != nil || reply["unsupported"] != true {
				return fmt.Errorf("get_metrics: %v %v", reply, err)
			}
			return nil
		}()
		stub.waitForClose(conn, n)
	}
	c := startConnection(t, "ws://"+stub.port(), nil, PingInterval, PongTimeout, nil)
	stub.reply()
	select {
	case err := <-results:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the requests were not all answered within 30 s")
	}
	if c.connections.Load() != 1 {
		t.Fatalf("%d connections", c.connections.Load())
	}
}

func TestASocketClosedByTheServerIsOpenedAgain(t *testing.T) {
	stub := newRelayStub(t, 0)
	stub.then = func(conn *websocket.Conn, n int) {
		if n == 1 {
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1012, "gateway restart"),
				time.Now().Add(time.Second))
			_, _, _ = conn.ReadMessage() // the client's answer to the close
			_ = conn.Close()
			return
		}
		stub.waitForClose(conn, n)
	}
	log := &logs{}
	c := startConnection(t, "ws://"+stub.port()+"/", log, PingInterval, PongTimeout, nil)
	first, second := stub.reply(), stub.reply()
	if first["request_id"] == second["request_id"] {
		t.Fatal("no new executor_info on the new socket")
	}
	eventually(t, 5*time.Second, "the second connection", func() bool { return c.connections.Load() == 2 })
	if stub.count() != 2 {
		t.Fatalf("%d connections", stub.count())
	}
	if lost := log.matching(slog.LevelWarn, "connection to Relay lost (code 1012: gateway restart); reconnecting"); len(lost) != 1 {
		t.Fatalf("logs %v", log.all())
	}
	// Answered on the new socket: the next loss is retried after the first delay again.
	eventually(t, 5*time.Second, "the backoff's reset", func() bool { return c.backoff.Attempts() == 0 })
}

func TestAServerThatStopsAnsweringPingsIsDroppedWithinThePongTimeout(t *testing.T) {
	stub := newRelayStub(t, 0)
	p := newProxy(t, stub.port())
	log := &logs{}
	c := startConnection(t, "ws://"+p.address()+"/", log, 200*time.Millisecond, 500*time.Millisecond, nil)
	stub.reply()
	// While the proxy forwards, the pongs come back and the socket stays: past several pong timeouts.
	time.Sleep(1500 * time.Millisecond)
	if c.connections.Load() != 1 || len(log.matching(slog.LevelWarn, "no pong")) != 0 {
		t.Fatalf("dropped while the server answered: %v", log.all())
	}
	frozenAt := time.Now()
	p.freeze()
	stub.reply() // the client came back, through the proxy, on a new link
	drops := log.matching(slog.LevelWarn, "relay-dbos: no pong from Relay within 0.5 s; reconnecting")
	if len(drops) != 1 {
		t.Fatalf("logs %v", log.all())
	}
	// The next ping within 0.2 s, its pong overdue 0.5 s later.
	if waited := drops[0].at.Sub(frozenAt); waited < 300*time.Millisecond || waited > 1500*time.Millisecond {
		t.Fatalf("dropped %s after the freeze", waited)
	}
	if !c.waitConnected(5*time.Second) || c.connections.Load() != 2 || stub.count() != 2 {
		t.Fatalf("%d connections", c.connections.Load())
	}
	eventually(t, 5*time.Second, "the connected line", func() bool {
		return len(log.matching(slog.LevelInfo, "connected to Relay at ws://"+p.address()+"/websocket/"+testApp+"/***")) == 2
	})
}

func TestCloseEndsWithANormalClose(t *testing.T) {
	stub := newRelayStub(t, 0)
	c := startConnection(t, "ws://"+stub.port()+"/", nil, 50*time.Millisecond, 500*time.Millisecond, nil)
	stub.reply()
	if !c.waitConnected(5 * time.Second) {
		t.Fatal("not connected")
	}
	started := time.Now()
	c.close(5 * time.Second)
	if elapsed := time.Since(started); elapsed > 2*time.Second {
		t.Fatalf("close took %s", elapsed)
	}
	select {
	case <-c.done:
	default:
		t.Fatal("the connection did not end")
	}
	if c.up() {
		t.Fatal("still connected")
	}
	eventually(t, 5*time.Second, "the server seeing the close", func() bool {
		stub.mu.Lock()
		defer stub.mu.Unlock()
		return len(stub.closes) == 1
	})
	stub.mu.Lock()
	seen := stub.closes[0]
	stub.mu.Unlock()
	if seen != (closeSeen{1000, ""}) {
		t.Fatalf("close %v", seen)
	}
	c.close(time.Second) // idempotent
	if stub.count() != 1 {
		t.Fatal("reconnected after close")
	}
}

func TestCloseWhileWaitingToReconnect(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := listener.Addr().String()
	_ = listener.Close() // a port nobody listens on
	c := startConnection(t, "ws://"+address+"/", nil, PingInterval, PongTimeout,
		&Backoff{Initial: 20 * time.Second, Cap: 30 * time.Second, Jitter: 0.2})
	eventually(t, 5*time.Second, "a failed attempt", func() bool { return c.backoff.Attempts() >= 1 })
	started := time.Now()
	c.close(5 * time.Second)
	if elapsed := time.Since(started); elapsed > time.Second {
		t.Fatalf("close took %s, not the 16-20 s backoff", elapsed)
	}
}

func TestTheKeyIsNeverLogged(t *testing.T) {
	for _, c := range []string{"refused", "bad port", "not ws"} {
		t.Run(c, func(t *testing.T) {
			log := &logs{}
			var conn *connection
			if c == "refused" {
				stub := newRelayStub(t, http.StatusForbidden)
				conn = startConnection(t, "ws://"+stub.port()+"/", log, PingInterval, PongTimeout, nil)
				eventually(t, 5*time.Second, "three refused attempts", func() bool {
					stub.mu.Lock()
					defer stub.mu.Unlock()
					return len(stub.paths) >= 3
				})
			} else {
				base := "ws://127.0.0.1:99999/"
				if c == "not ws" {
					base = "http://127.0.0.1:1/"
				}
				conn = startConnection(t, base, log, PingInterval, PongTimeout, nil)
				eventually(t, 5*time.Second, "three failed attempts", func() bool { return conn.backoff.Attempts() >= 3 })
			}
			conn.close(5 * time.Second)
			records := log.all()
			for _, r := range records {
				if strings.Contains(r.text, secretPart) {
					t.Fatalf("the key is in %q", r.text)
				}
			}
			if c == "refused" {
				if got := log.matching(slog.LevelWarn, "Relay refused the connection"); len(got) < 3 ||
					!strings.Contains(got[0].text, "HTTP 403") || !strings.Contains(got[0].text, "/websocket/"+testApp+"/***") {
					t.Fatalf("logs %v", records)
				}
			} else if got := log.matching(slog.LevelWarn, "cannot reach Relay"); len(got) < 3 {
				t.Fatalf("logs %v", records)
			}
		})
	}
}

func TestConnectRunsTheClientUntilClose(t *testing.T) {
	stub := newRelayStub(t, 0)
	t.Setenv("RELAY_URL", "ws://"+stub.port()+"/")
	t.Setenv("RELAY_API_KEY", testKey)
	r, err := Connect(env.ctx, Options{ExecutorMetadata: m{"pod": "orders-0"}, PingInterval: 200 * time.Millisecond,
		PongTimeout: time.Second, Logger: testLogger(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	reply := stub.reply()
	if metadata, _ := json.Marshal(reply["executor_metadata"]); string(metadata) != `{"pod":"orders-0"}` ||
		reply["executor_id"] != env.executorID {
		t.Fatalf("reply %v", reply)
	}
	if want := "/websocket/" + testApp + "/" + quotedKey; stub.pathList()[0] != want { // the name read from the database
		t.Fatalf("path %s, want %s", stub.pathList()[0], want)
	}
	if !r.WaitConnected(5*time.Second) || !r.Connected() {
		t.Fatal("not connected")
	}
	r.Close()
	r.Close()
	if r.Connected() {
		t.Fatal("connected after Close")
	}
	eventually(t, 5*time.Second, "the normal close", func() bool {
		stub.mu.Lock()
		defer stub.mu.Unlock()
		return len(stub.closes) == 1 && stub.closes[0] == closeSeen{1000, ""}
	})
}

func TestConnectNeedsAURLAndAKey(t *testing.T) {
	t.Setenv("RELAY_URL", "")
	t.Setenv("RELAY_API_KEY", "")
	if _, err := Connect(env.ctx, Options{Key: testKey}); err == nil || !strings.Contains(err.Error(), "no Relay URL") {
		t.Fatalf("err %v", err)
	}
	if _, err := Connect(env.ctx, Options{URL: "ws://127.0.0.1:1/"}); err == nil || !strings.Contains(err.Error(), "no API key") {
		t.Fatalf("err %v", err)
	}
}

func TestConnectRefusesAnotherSDKRelease(t *testing.T) {
	stub := newRelayStub(t, 0)
	for _, found := range []string{"v1.8.0", "v1.10.0", ""} {
		sdkVersion = func() string { return found }
		r, err := Connect(env.ctx, Options{URL: "ws://" + stub.port() + "/", Key: testKey})
		sdkVersion = pinnedSDK
		if r != nil || err == nil || strings.Contains(err.Error(), "\n") ||
			!strings.HasPrefix(err.Error(), "relay-dbos-go "+Version+" supports "+SDKModule+" v1.9.x; this program has ") {
			t.Fatalf("%q: %v", found, err)
		}
	}
	if stub.count() != 0 {
		t.Fatal("a refused Connect dialled Relay")
	}
}
