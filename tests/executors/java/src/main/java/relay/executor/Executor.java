// A real DBOS Java executor (dev.dbos:transact, pinned in pom.xml) for Relay's end-to-end tests, run as a
// subprocess (java -jar target/executor.jar): the Java twin of tests/executors/typescript/executor.js.
//
// Environment: RELAY_URL (the conductor URL, ws://host:port/), RELAY_KEY, APP_NAME, APP_VERSION (default v1),
// SYS_DB_URL (postgresql://user@host:port/dbname: the Java SDK's system database is PostgreSQL only), STEP_LOG (a
// file each step appends "<pid> <step>" to), STEP_SECONDS (default 0.3), EXECUTOR_METADATA (a JSON object sent in
// executor_info), START_WORKFLOW (a workflow id to start once the file START_WORKFLOW_WHEN exists),
// FINISHED_WORKFLOWS (comma-separated ids of workflows run to completion at launch) and PENDING_WORKFLOWS
// (comma-separated ids of workflows started at launch that sleep for an hour, so stay PENDING).
// Runs until SIGTERM or SIGINT, then shuts DBOS down and exits 0.
package relay.executor;

import dev.dbos.transact.DBOS;
import dev.dbos.transact.StartWorkflowOptions;
import dev.dbos.transact.config.DBOSConfig;
import dev.dbos.transact.workflow.Workflow;

import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import tools.jackson.core.type.TypeReference;
import tools.jackson.databind.json.JsonMapper;

import sun.misc.Signal;

public final class Executor {
  static final int STEPS = 20;

  /** The workflows, called through the proxy that DBOS.registerProxy returns. */
  public interface Workflows {
    int twentySteps() throws Exception;

    String finishes();

    String waits();
  }

  static final class WorkflowsImpl implements Workflows {
    private final DBOS dbos;
    private final Path stepLog;
    private final long stepMillis;

    WorkflowsImpl(DBOS dbos, Path stepLog, long stepMillis) {
      this.dbos = dbos;
      this.stepLog = stepLog;
      this.stepMillis = stepMillis;
    }

    private int step(int i) throws Exception {
      Thread.sleep(stepMillis);
      String line = ProcessHandle.current().pid() + " " + i + "\n";
      Files.writeString(
          stepLog,
          line,
          StandardCharsets.UTF_8,
          StandardOpenOption.CREATE,
          StandardOpenOption.APPEND);
      return i;
    }

    @Override
    @Workflow(name = "twenty_steps")
    public int twentySteps() throws Exception {
      int total = 0;
      for (int i = 0; i < STEPS; i++) {
        final int n = i;
        total += dbos.runStep(() -> step(n), "step");
      }
      return total;
    }

    @Override
    @Workflow(name = "finishes")
    public String finishes() {
      return "done";
    }

    @Override
    @Workflow(name = "waits")
    public String waits() {
      dbos.sleep(Duration.ofSeconds(3600));
      return "woke";
    }
  }

  private static String env(String name, String fallback) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? fallback : v;
  }

  private static String required(String name) {
    String v = System.getenv(name);
    if (v == null || v.isEmpty()) {
      throw new IllegalArgumentException(name + " must be set");
    }
    return v;
  }

  private static List<String> ids(String name) {
    return Arrays.stream(env(name, "").split(",")).map(String::trim).filter(s -> !s.isEmpty()).toList();
  }

  /** postgresql://user[:password]@host:port/dbname[?query] as a JDBC URL, a user and a password. */
  record Jdbc(String url, String user, String password) {
    static Jdbc of(String pgUrl) {
      URI uri = URI.create(pgUrl);
      String user = "postgres";
      String password = "";
      String info = uri.getRawUserInfo();
      if (info != null && !info.isEmpty()) {
        int colon = info.indexOf(':');
        user = decode(colon < 0 ? info : info.substring(0, colon));
        password = colon < 0 ? "" : decode(info.substring(colon + 1));
      }
      String host = uri.getHost() == null ? "localhost" : uri.getHost();
      String port = uri.getPort() < 0 ? "" : ":" + uri.getPort();
      String query = uri.getRawQuery() == null ? "" : "?" + uri.getRawQuery();
      return new Jdbc("jdbc:postgresql://" + host + port + uri.getRawPath() + query, user, password);
    }

    private static String decode(String s) {
      return java.net.URLDecoder.decode(s, StandardCharsets.UTF_8);
    }
  }

  public static void main(String[] args) {
    try {
      run();
    } catch (Throwable e) {
      System.err.println("executor: " + e);
      if (!(e instanceof IllegalArgumentException)) {
        e.printStackTrace();
      }
      System.exit(1);
    }
    System.exit(0);
  }

  private static void run() throws Exception {
    CountDownLatch stop = new CountDownLatch(1);
    // Replace the JVM's own SIGTERM/SIGINT handling (which exits 143/130) so that a signal shuts down cleanly.
    Signal.handle(new Signal("TERM"), s -> stop.countDown());
    Signal.handle(new Signal("INT"), s -> stop.countDown());

    long stepMillis = Math.round(Double.parseDouble(env("STEP_SECONDS", "0.3")) * 1000);
    Path stepLog = Path.of(env("STEP_LOG", "/dev/null"));
    Map<String, Object> metadata = null;
    String rawMetadata = System.getenv("EXECUTOR_METADATA");
    if (rawMetadata != null && !rawMetadata.isEmpty()) {
      metadata = JsonMapper.builder().build().readValue(rawMetadata, new TypeReference<Map<String, Object>>() {});
    }
    Jdbc db = Jdbc.of(required("SYS_DB_URL"));

    DBOSConfig config =
        DBOSConfig.defaults(required("APP_NAME"))
            .withDatabaseUrl(db.url())
            .withDbUser(db.user())
            .withDbPassword(db.password())
            .withAppVersion(env("APP_VERSION", "v1"))
            .withConductorKey(env("RELAY_KEY", null))
            .withConductorDomain(env("RELAY_URL", null))
            .withConductorExecutorMetadata(metadata);
    DBOS dbos = new DBOS(config);
    Workflows workflows =
        dbos.registerProxy(Workflows.class, new WorkflowsImpl(dbos, stepLog, stepMillis));
    dbos.launch();
    System.out.println("executor pid " + ProcessHandle.current().pid() + " launched");

    try {
      for (String id : ids("FINISHED_WORKFLOWS")) {
        dbos.startWorkflow(workflows::finishes, new StartWorkflowOptions(id)).getResult();
      }
      for (String id : ids("PENDING_WORKFLOWS")) {
        dbos.startWorkflow(workflows::waits, new StartWorkflowOptions(id));
      }
      String workflowId = System.getenv("START_WORKFLOW");
      if (workflowId != null && !workflowId.isEmpty()) {
        Path when = Path.of(required("START_WORKFLOW_WHEN"));
        while (!Files.exists(when)) {
          if (stop.await(50, TimeUnit.MILLISECONDS)) {
            break;
          }
        }
        if (stop.getCount() > 0) {
          dbos.startWorkflow(workflows::twentySteps, new StartWorkflowOptions(workflowId));
          System.out.println("started workflow " + workflowId);
        }
      }
      stop.await();
    } finally {
      dbos.shutdown();
    }
  }
}
