package interop;

import akka.actor.typed.ActorSystem;
import akka.persistence.query.DeletedDurableState;
import akka.persistence.query.DurableStateChange;
import akka.persistence.query.NoOffset;
import akka.persistence.query.UpdatedDurableState;
import akka.persistence.r2dbc.state.javadsl.R2dbcDurableStateStore;
import akka.persistence.state.DurableStateStoreRegistry;
import akka.persistence.state.javadsl.GetObjectResult;
import akka.stream.javadsl.Sink;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The plugin's durable state store (R2dbcDurableStateStore, table durable_state) for the interop
 * tests: state-get pid=P, state-upsert pid=P revision=R value=JSON [manifest=M] [tag=T],
 * state-changes entity-type=T min-slice=A max-slice=B (the current changes by slices).
 */
final class StateCommands {
  private StateCommands() {}

  @SuppressWarnings("unchecked")
  private static R2dbcDurableStateStore<JsonValue> store(ActorSystem<?> system) {
    return DurableStateStoreRegistry.get(system)
        .getDurableStateStoreFor(R2dbcDurableStateStore.class, R2dbcDurableStateStore.Identifier());
  }

  /** state-get pid=P: prints pid, revision and value (null: no state). */
  static void get(ActorSystem<?> system, Map<String, String> o) throws Exception {
    String pid = Main.req(o, "pid");
    GetObjectResult<JsonValue> r = store(system).getObject(pid).toCompletableFuture().get(60, TimeUnit.SECONDS);
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("pid", pid);
    line.put("revision", r.revision());
    if (r.value().isPresent()) {
      line.put("manifest", r.value().get().manifest);
      line.set("value", r.value().get().node);
    } else {
      line.putNull("value");
    }
    Main.emit(line);
  }

  /** state-upsert pid=P revision=R value=JSON: the plugin's upsertObject (fails on a wrong revision). */
  static void upsert(ActorSystem<?> system, Map<String, String> o) throws Exception {
    String pid = Main.req(o, "pid");
    long revision = Long.parseLong(Main.req(o, "revision"));
    JsonValue value = new JsonValue(o.getOrDefault("manifest", ""), JsonSerializer.MAPPER.readTree(Main.req(o, "value")));
    store(system).upsertObject(pid, revision, value, o.getOrDefault("tag", "")).toCompletableFuture()
        .get(60, TimeUnit.SECONDS);
    ObjectNode line = JsonNodeFactory.instance.objectNode();
    line.put("pid", pid);
    line.put("revision", revision);
    Main.emit(line);
  }

  /** state-changes entity-type=T [min-slice=0] [max-slice=1023]: one line per change, then done. */
  static void changes(ActorSystem<?> system, Map<String, String> o) throws Exception {
    String type = Main.req(o, "entity-type");
    int min = Integer.parseInt(o.getOrDefault("min-slice", "0"));
    int max = Integer.parseInt(o.getOrDefault("max-slice", "1023"));
    List<DurableStateChange<JsonValue>> all = store(system)
        .currentChangesBySlices(type, min, max, NoOffset.getInstance())
        .runWith(Sink.seq(), system).toCompletableFuture().get(120, TimeUnit.SECONDS);
    for (DurableStateChange<JsonValue> c : all) {
      ObjectNode line = JsonNodeFactory.instance.objectNode();
      if (c instanceof UpdatedDurableState<JsonValue> u) {
        line.put("pid", u.persistenceId());
        line.put("revision", u.revision());
        line.set("value", u.value().node);
      } else if (c instanceof DeletedDurableState<JsonValue> d) {
        line.put("pid", d.persistenceId());
        line.put("revision", d.revision());
        line.put("deleted", true);
      }
      Main.emit(line);
    }
    ObjectNode done = JsonNodeFactory.instance.objectNode();
    done.put("done", all.size());
    Main.emit(done);
  }
}
