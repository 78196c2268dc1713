package interop;

import akka.Done;
import akka.actor.typed.ActorRef;
import akka.actor.typed.ActorSystem;
import akka.actor.typed.SpawnProtocol;
import akka.actor.typed.javadsl.AskPattern;
import akka.persistence.query.DeletedDurableState;
import akka.persistence.query.DurableStateChange;
import akka.persistence.query.Offset;
import akka.persistence.query.UpdatedDurableState;
import akka.persistence.r2dbc.state.javadsl.R2dbcDurableStateStore;
import akka.projection.ProjectionBehavior;
import akka.projection.ProjectionId;
import akka.projection.javadsl.SourceProvider;
import akka.projection.r2dbc.javadsl.R2dbcHandler;
import akka.projection.r2dbc.javadsl.R2dbcProjection;
import akka.projection.r2dbc.javadsl.R2dbcSession;
import akka.projection.state.javadsl.DurableStateSourceProvider;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

/**
 * state-session name=N entity-type=T [table=jvm_state_seen]: one JVM for a whole durable state
 * test. It runs an exactly-once R2dbcProjection over the plugin's
 * DurableStateSourceProvider.changesBySlices (slices 0-1023, the plugin's offset store), whose
 * handler inserts (projection_name, persistence_id, revision, value, deleted) under a primary key
 * on the first three (a second delivery of a revision would fail) and prints
 * {"projected": pid, "revision": r, "deleted": b, "value": v}. Commands come on stdin, one JSON
 * object a line, each answered by a line with the same "id":
 * {"op": "put", "pid": P, "value": V} and {"op": "delete", "pid": P} through the pid's running
 * StateEntity (started, and so recovered, on first use); {"op": "recover", "pid": P} stops that
 * entity and recovers a new one from the store (answer: value and revision);
 * {"op": "restart-projection"} stops the projection and starts it again from its stored offsets.
 * Ends when stdin closes.
 */
final class StateSession {
  private static final Duration ASK = Duration.ofSeconds(60);

  private final ActorSystem<SpawnProtocol.Command> system;
  private final String name;
  private final String type;
  private final String insert;
  private final Map<String, ActorRef<StateEntity.Command>> entities = new HashMap<>();
  private int spawned;
  private ActorRef<ProjectionBehavior.Command> projection;

  private StateSession(ActorSystem<SpawnProtocol.Command> system, String name, String type, String table) {
    this.system = system;
    this.name = name;
    this.type = type;
    this.insert = "INSERT INTO " + table
        + " (projection_name, persistence_id, revision, value, deleted) VALUES ($1, $2, $3, $4, $5)";
  }

  static void run(ActorSystem<SpawnProtocol.Command> system, Map<String, String> o) throws Exception {
    String table = o.getOrDefault("table", "jvm_state_seen");
    if (!table.matches("[a-z_][a-z0-9_]*")) throw new IllegalArgumentException("bad table name " + table);
    StateSession session = new StateSession(system, Main.req(o, "name"), Main.req(o, "entity-type"), table);
    session.startProjection();
    ObjectNode ready = JsonNodeFactory.instance.objectNode();
    ready.put("started", session.name);
    Main.emit(ready);
    try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      String line;
      while ((line = in.readLine()) != null) {
        if (!line.isBlank()) Main.emit(session.answer(JsonSerializer.MAPPER.readTree(line)));
      }
    }
    session.stopProjection();
    ObjectNode done = JsonNodeFactory.instance.objectNode();
    done.put("done", true);
    Main.emit(done);
  }

  private ObjectNode answer(JsonNode cmd) throws Exception {
    ObjectNode out = JsonNodeFactory.instance.objectNode();
    out.set("id", cmd.get("id"));
    String op = cmd.get("op").asText();
    switch (op) {
      case "put" -> {
        long revision = this.<Long>ask(entity(cmd.get("pid").asText()), r -> new StateEntity.Put(cmd.get("value"), r));
        out.put("revision", revision);
      }
      case "delete" -> {
        long revision = this.<Long>ask(entity(cmd.get("pid").asText()), StateEntity.Delete::new);
        out.put("revision", revision);
      }
      case "recover" -> {
        String pid = cmd.get("pid").asText();
        ActorRef<StateEntity.Command> old = entities.remove(pid);
        if (old != null) old.tell(new StateEntity.Stop());
        StateEntity.Current c = ask(entity(pid), StateEntity.Get::new);
        out.put("revision", c.revision());
        out.set("value", c.value());
      }
      case "restart-projection" -> {
        stopProjection();
        startProjection();
        out.put("restarted", true);
      }
      default -> throw new IllegalArgumentException("unknown op " + op);
    }
    return out;
  }

  private <T> T ask(ActorRef<StateEntity.Command> ref, akka.japi.function.Function<ActorRef<T>, StateEntity.Command> msg)
      throws Exception {
    return AskPattern.ask(ref, msg, ASK, system.scheduler()).toCompletableFuture().get(60, TimeUnit.SECONDS);
  }

  private ActorRef<StateEntity.Command> entity(String pid) throws Exception {
    ActorRef<StateEntity.Command> ref = entities.get(pid);
    if (ref == null) {
      ref = Main.spawn(system, StateEntity.create(pid), "state-" + (++spawned));
      entities.put(pid, ref);
    }
    return ref;
  }

  private void startProjection() throws Exception {
    SourceProvider<Offset, DurableStateChange<JsonValue>> provider = DurableStateSourceProvider.changesBySlices(
        system, R2dbcDurableStateStore.Identifier(), type, 0, 1023);
    var p = R2dbcProjection.exactlyOnce(
        ProjectionId.of(name, "0-1023"), Optional.empty(), provider,
        () -> new R2dbcHandler<DurableStateChange<JsonValue>>() {
          @Override
          public CompletionStage<Done> process(R2dbcSession session, DurableStateChange<JsonValue> change) {
            return record(session, change);
          }
        },
        system);
    projection = Main.spawn(system, ProjectionBehavior.create(p), "projection-" + (++spawned));
  }

  private CompletionStage<Done> record(R2dbcSession session, DurableStateChange<JsonValue> change) {
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    var stmt = session.createStatement(insert).bind(0, name);
    if (change instanceof UpdatedDurableState<JsonValue> u) {
      line.put("projected", u.persistenceId());
      line.put("revision", u.revision());
      line.put("deleted", false);
      line.set("value", u.value().node);
      stmt = stmt.bind(1, u.persistenceId()).bind(2, u.revision()).bind(3, u.value().node.toString()).bind(4, false);
    } else if (change instanceof DeletedDurableState<JsonValue> d) {
      line.put("projected", d.persistenceId());
      line.put("revision", d.revision());
      line.put("deleted", true);
      line.putNull("value");
      stmt = stmt.bind(1, d.persistenceId()).bind(2, d.revision()).bindNull(3, String.class).bind(4, true);
    } else {
      throw new IllegalStateException("unknown change " + change);
    }
    return session.updateOne(stmt).thenApply(n -> {
      Main.emit(line);
      return Done.getInstance();
    });
  }

  private void stopProjection() throws Exception {
    ActorRef<ProjectionBehavior.Command> ref = projection;
    CompletableFuture<Done> stopped = new CompletableFuture<>();
    Main.spawn(system, akka.actor.typed.javadsl.Behaviors.<Object>setup(ctx -> {
      ctx.watch(ref);
      ref.tell(ProjectionBehavior.stopMessage());
      return akka.actor.typed.javadsl.Behaviors.receive(Object.class)
          .onSignal(akka.actor.typed.Terminated.class, t -> {
            stopped.complete(Done.getInstance());
            return akka.actor.typed.javadsl.Behaviors.stopped();
          })
          .build();
    }), "stopper-" + (++spawned));
    stopped.get(60, TimeUnit.SECONDS);
  }
}
