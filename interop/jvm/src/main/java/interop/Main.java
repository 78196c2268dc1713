package interop;

import akka.Done;
import akka.NotUsed;
import akka.actor.typed.ActorRef;
import akka.actor.typed.ActorSystem;
import akka.actor.typed.Props;
import akka.actor.typed.SpawnProtocol;
import akka.actor.typed.javadsl.AskPattern;
import akka.persistence.query.NoOffset;
import akka.persistence.query.PersistenceQuery;
import akka.persistence.query.TimestampOffset;
import akka.persistence.query.typed.EventEnvelope;
import akka.persistence.r2dbc.query.javadsl.R2dbcReadJournal;
import akka.projection.ProjectionBehavior;
import akka.projection.ProjectionId;
import akka.projection.eventsourced.javadsl.EventSourcedProvider;
import akka.projection.javadsl.SourceProvider;
import akka.projection.r2dbc.javadsl.R2dbcHandler;
import akka.projection.r2dbc.javadsl.R2dbcProjection;
import akka.projection.r2dbc.javadsl.R2dbcSession;
import akka.stream.javadsl.Source;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Command line driver of the Akka Persistence R2DBC plugin for slice-journal's interop tests.
 *
 * <p>Usage: {@code interop.Main <command> key=value...}; every result is printed on stdout as
 * one JSON object per line. Commands: persist, replay, events-by-slices, project, and the durable
 * state store's state-get, state-upsert, state-changes ({@link StateCommands}) and state-session
 * (a DurableStateBehavior and the plugin's changes-by-slices projection, {@link StateSession}). The connection
 * comes from system properties (akka.persistence.r2dbc.connection-factory.*). Long-running
 * commands stop when stdin is closed.
 */
public final class Main {
  private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);
  private static final Duration ASK = Duration.ofSeconds(60);

  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 0) {
      System.err.println("usage: interop.Main persist|replay|events-by-slices|project|state-get|state-upsert|state-changes|state-session key=value...");
      System.exit(2);
    }
    Map<String, String> opts = new HashMap<>();
    for (int i = 1; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      if (eq < 0) throw new IllegalArgumentException("expected key=value, got " + args[i]);
      opts.put(args[i].substring(0, eq), args[i].substring(eq + 1));
    }
    ActorSystem<SpawnProtocol.Command> system = ActorSystem.create(SpawnProtocol.create(), "interop");
    int status = 0;
    try {
      switch (args[0]) {
        case "persist" -> persist(system, opts);
        case "replay" -> replay(system, opts);
        case "events-by-slices" -> eventsBySlices(system, opts);
        case "project" -> project(system, opts);
        case "state-get" -> StateCommands.get(system, opts);
        case "state-upsert" -> StateCommands.upsert(system, opts);
        case "state-changes" -> StateCommands.changes(system, opts);
        case "state-session" -> StateSession.run(system, opts);
        default -> throw new IllegalArgumentException("unknown command " + args[0]);
      }
    } catch (Throwable t) {
      t.printStackTrace();
      status = 1;
    } finally {
      system.terminate();
      system.getWhenTerminated().toCompletableFuture().get(30, TimeUnit.SECONDS);
    }
    System.exit(status);
  }

  static String req(Map<String, String> o, String k) {
    String v = o.get(k);
    if (v == null) throw new IllegalArgumentException("missing " + k + "=");
    return v;
  }

  private static int intOpt(Map<String, String> o, String k, int dflt) {
    String v = o.get(k);
    return v == null ? dflt : Integer.parseInt(v);
  }

  static void emit(ObjectNode line) {
    synchronized (OUT) {
      OUT.println(line.toString());
    }
  }

  static <T> ActorRef<T> spawn(ActorSystem<SpawnProtocol.Command> system, akka.actor.typed.Behavior<T> b, String name)
      throws Exception {
    CompletionStage<ActorRef<T>> ref = AskPattern.ask(
        system, r -> new SpawnProtocol.Spawn<>(b, name, Props.empty(), r), ASK, system.scheduler());
    return ref.toCompletableFuture().get(60, TimeUnit.SECONDS);
  }

  /**
   * persist entity-type=T prefix=P entities=M events=N [per-call=1] [snapshot-every=K] [tag=G]: M entities at once,
   * each writing its N events in calls of per-call events (one atomic write each). warmup=W first
   * writes 5 events to each of W other entities, untimed (JIT, connection pool). The time printed
   * starts once every entity has recovered (its empty history read), so it is the writes' alone.
   */
  private static void persist(ActorSystem<SpawnProtocol.Command> system, Map<String, String> o) throws Exception {
    String type = req(o, "entity-type");
    String prefix = o.getOrDefault("prefix", "jvm");
    int entities = intOpt(o, "entities", 1);
    int events = intOpt(o, "events", 1);
    int snapshotEvery = intOpt(o, "snapshot-every", 0);
    int perCall = intOpt(o, "per-call", 1);
    int warmup = intOpt(o, "warmup", 0);
    String tag = o.getOrDefault("tag", "");
    if (warmup > 0) writeAll(system, type, "warmup-" + prefix, warmup, 5, perCall, 0, tag);
    double seconds = writeAll(system, type, prefix, entities, events, perCall, snapshotEvery, tag);
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("written", (long) entities * events);
    line.put("seconds", seconds);
    emit(line);
  }

  /**
   * Spawn the entities and wait until each has recovered, then write: all entities at once, each its
   * events in calls of perCall. Returns the seconds the writes took.
   */
  private static double writeAll(ActorSystem<SpawnProtocol.Command> system, String type, String prefix, int entities,
      int events, int perCall, int snapshotEvery, String tag) throws Exception {
    List<ActorRef<Entity.Command>> refs = new ArrayList<>();
    List<CompletableFuture<Entity.Snapshot>> recovered = new ArrayList<>();
    for (int i = 0; i < entities; i++) {
      String pid = type + "|" + prefix + "-" + i;
      ActorRef<Entity.Command> ref = spawn(system, Entity.create(pid, snapshotEvery, tag), prefix + "-" + i);
      refs.add(ref);
      recovered.add(AskPattern.<Entity.Command, Entity.Snapshot>ask(ref, Entity.Get::new, ASK, system.scheduler())
          .toCompletableFuture());
    }
    CompletableFuture.allOf(recovered.toArray(new CompletableFuture[0])).get(600, TimeUnit.SECONDS);
    long started = System.nanoTime();
    List<CompletableFuture<Long>> all = new ArrayList<>();
    for (int i = 0; i < entities; i++) {
      final int entity = i;
      ActorRef<Entity.Command> ref = refs.get(i);
      CompletionStage<Long> chain = CompletableFuture.completedFuture(0L);
      for (int k = 1; k <= events; k += perCall) {
        final int first = k;
        final int last = Math.min(events, k + perCall - 1);
        chain = chain.thenCompose(prev -> {
          List<com.fasterxml.jackson.databind.JsonNode> payloads = new ArrayList<>();
          for (int n = first; n <= last; n++) {
            ObjectNode payload = JsonNodeFactory.instance.objectNode();
            payload.put("writer", "jvm");
            payload.put("entity", entity);
            payload.put("n", n);
            payloads.add(payload);
          }
          return AskPattern.<Entity.Command, Long>ask(
              ref, r -> new Entity.Append(payloads, "", r), ASK, system.scheduler());
        });
      }
      all.add(chain.toCompletableFuture());
    }
    CompletableFuture.allOf(all.toArray(new CompletableFuture[0])).get(600, TimeUnit.SECONDS);
    return (System.nanoTime() - started) / 1e9;
  }

  /** replay pid=P: recover the entity (snapshot + events) and print its state and sequence number. */
  private static void replay(ActorSystem<SpawnProtocol.Command> system, Map<String, String> o) throws Exception {
    String pid = req(o, "pid");
    ActorRef<Entity.Command> ref = spawn(system, Entity.create(pid, intOpt(o, "snapshot-every", 0)), "replay");
    Entity.Snapshot s = AskPattern.<Entity.Command, Entity.Snapshot>ask(ref, Entity.Get::new, ASK, system.scheduler())
        .toCompletableFuture().get(60, TimeUnit.SECONDS);
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("pid", pid);
    line.put("seq_nr", s.seqNr());
    line.set("state", s.state().node);
    emit(line);
  }

  private static ObjectNode envelopeJson(EventEnvelope<?> env) {
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("pid", env.persistenceId());
    line.put("seq_nr", env.sequenceNr());
    line.put("slice", env.slice());
    line.put("entity_type", env.entityType());
    line.put("source", env.source());
    Instant ts = ((TimestampOffset) env.offset()).timestamp();
    line.put("timestamp_micros", ts.getEpochSecond() * 1_000_000L + ts.getNano() / 1000);
    Object event = env.getOptionalEvent().orElse(null);
    if (event instanceof JsonValue v) {
      line.put("manifest", v.manifest);
      line.set("payload", v.node);
    } else {
      line.putNull("payload");
    }
    return line;
  }

  /**
   * events-by-slices entity-type=T [min=0 max=1023] [live=false] [expect=K] [timeout=120] [print=true]: print
   * every envelope (print=false: only the closing count and seconds). Current: until the query
   * completes. Live: until K distinct events were seen, the timeout passes, or stdin closes.
   */
  private static void eventsBySlices(ActorSystem<SpawnProtocol.Command> system, Map<String, String> o) throws Exception {
    String type = req(o, "entity-type");
    int min = intOpt(o, "min", 0);
    int max = intOpt(o, "max", 1023);
    boolean live = Boolean.parseBoolean(o.getOrDefault("live", "false"));
    int expect = intOpt(o, "expect", Integer.MAX_VALUE);
    int timeout = intOpt(o, "timeout", 120);
    boolean print = Boolean.parseBoolean(o.getOrDefault("print", "true"));
    if (!live && Boolean.parseBoolean(o.getOrDefault("warmup", "false"))) {
      R2dbcReadJournal j = PersistenceQuery.get(system).getReadJournalFor(R2dbcReadJournal.class, R2dbcReadJournal.Identifier());
      j.currentEventsBySlices(type, min, max, NoOffset.getInstance()).run(system).toCompletableFuture().get(timeout, TimeUnit.SECONDS);
    }
    R2dbcReadJournal journal =
        PersistenceQuery.get(system).getReadJournalFor(R2dbcReadJournal.class, R2dbcReadJournal.Identifier());
    Source<EventEnvelope<Object>, NotUsed> source = live
        ? journal.eventsBySlices(type, min, max, NoOffset.getInstance())
        : journal.currentEventsBySlices(type, min, max, NoOffset.getInstance());
    java.util.Set<String> seen = java.util.concurrent.ConcurrentHashMap.newKeySet();
    long started = System.nanoTime();
    CompletionStage<Done> done = source
        .takeWhile(env -> seen.size() < expect, true)
        .map(env -> {
          seen.add(env.persistenceId() + "#" + env.sequenceNr());
          if (print) emit(envelopeJson(env));
          return env;
        })
        .takeWhile(env -> seen.size() < expect)
        .run(system);
    CompletableFuture<Done> f = done.toCompletableFuture();
    if (live) stopOnStdinClose(f);
    try {
      f.get(timeout, TimeUnit.SECONDS);
    } catch (java.util.concurrent.TimeoutException e) {
      // a live query that saw fewer events than expected: the test judges the lines printed
    }
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("done", true);
    line.put("distinct", seen.size());
    line.put("seconds", (System.nanoTime() - started) / 1e9);
    emit(line);
  }

  private static void stopOnStdinClose(CompletableFuture<?> f) {
    Thread t = new Thread(() -> {
      try (BufferedReader r = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
        String l;
        while ((l = r.readLine()) != null && !l.trim().equals("stop")) {
          // ignore other input
        }
      } catch (Exception e) {
        // stdin gone: stop as well
      }
      f.complete(null);
    }, "stdin-watch");
    t.setDaemon(true);
    t.start();
  }

  /**
   * project name=N entity-type=T [min=0 max=1023] [table=jvm_projection_seen]: an exactly-once
   * R2dbcProjection over eventsBySlices with the plugin's offset store; its handler inserts
   * (projection_name, persistence_id, seq_nr, payload) into the table (primary key on the first
   * three, so a second delivery would fail) and prints each envelope. Runs until stdin closes.
   */
  private static void project(ActorSystem<SpawnProtocol.Command> system, Map<String, String> o) throws Exception {
    String name = req(o, "name");
    String type = req(o, "entity-type");
    int min = intOpt(o, "min", 0);
    int max = intOpt(o, "max", 1023);
    String table = o.getOrDefault("table", "jvm_projection_seen");
    if (!table.matches("[a-z_][a-z0-9_]*")) throw new IllegalArgumentException("bad table name " + table);
    String insert = "INSERT INTO " + table + " (projection_name, persistence_id, seq_nr, payload) VALUES ($1, $2, $3, $4)";
    AtomicLong handled = new AtomicLong();
    SourceProvider<akka.persistence.query.Offset, EventEnvelope<Object>> provider =
        EventSourcedProvider.eventsBySlices(system, R2dbcReadJournal.Identifier(), type, min, max);
    ProjectionId id = ProjectionId.of(name, min + "-" + max);
    var projection = R2dbcProjection.exactlyOnce(
        id, Optional.empty(), provider,
        () -> new R2dbcHandler<EventEnvelope<Object>>() {
          @Override
          public CompletionStage<Done> process(R2dbcSession session, EventEnvelope<Object> env) {
            Object event = env.getOptionalEvent().orElse(null);
            String payload = event instanceof JsonValue v ? v.node.toString() : null;
            var stmt = session.createStatement(insert)
                .bind(0, name).bind(1, env.persistenceId()).bind(2, env.sequenceNr());
            stmt = payload == null ? stmt.bindNull(3, String.class) : stmt.bind(3, payload);
            return session.updateOne(stmt).thenApply(n -> {
              handled.incrementAndGet();
              emit(envelopeJson(env));
              return Done.getInstance();
            });
          }
        },
        system);
    ActorRef<ProjectionBehavior.Command> ref = spawn(system, ProjectionBehavior.create(projection), "projection");
    CompletableFuture<Object> stop = new CompletableFuture<>();
    stopOnStdinClose(stop);
    ObjectNode ready = JsonNodeFactory.instance.objectNode();
    ready.put("started", name);
    emit(ready);
    stop.get();
    CompletableFuture<Done> stopped = new CompletableFuture<>();
    spawn(system, akka.actor.typed.javadsl.Behaviors.<Object>setup(ctx -> {
      ctx.watch(ref);
      ref.tell(ProjectionBehavior.stopMessage());
      return akka.actor.typed.javadsl.Behaviors.receive(Object.class)
          .onSignal(akka.actor.typed.Terminated.class, t -> {
            stopped.complete(Done.getInstance());
            return akka.actor.typed.javadsl.Behaviors.stopped();
          })
          .build();
    }), "stopper");
    stopped.get(60, TimeUnit.SECONDS);
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("done", true);
    line.put("handled", handled.get());
    emit(line);
  }
}
