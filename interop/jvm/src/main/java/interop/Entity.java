package interop;

import akka.actor.typed.ActorRef;
import akka.actor.typed.Behavior;
import akka.actor.typed.javadsl.ActorContext;
import akka.actor.typed.javadsl.Behaviors;
import akka.persistence.typed.PersistenceId;
import akka.persistence.typed.javadsl.CommandHandler;
import akka.persistence.typed.javadsl.EventHandler;
import akka.persistence.typed.javadsl.EventSourcedBehavior;
import akka.persistence.typed.javadsl.RetentionCriteria;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;
import java.util.Set;

/**
 * An entity whose events are JSON values and whose state is {"events": [payload, ...]}: the list
 * of every event payload it has recovered or persisted, so a test can compare it with what the
 * other side wrote. Snapshots (every {@code snapshotEvery} events, 0 = never) store that state.
 */
public final class Entity extends EventSourcedBehavior<Entity.Command, JsonValue, JsonValue> {
  public interface Command {}

  /** Persist these events atomically (one write); the reply is the entity's sequence number after them. */
  public record Append(List<JsonNode> payloads, String manifest, ActorRef<Long> replyTo) implements Command {}

  /** Reply with the state and the last sequence number. */
  public record Get(ActorRef<Snapshot> replyTo) implements Command {}

  public record Snapshot(JsonValue state, long seqNr) {}

  private final int snapshotEvery;
  private final String tag;
  private final ActorContext<Command> context;

  private Entity(PersistenceId pid, int snapshotEvery, String tag, ActorContext<Command> context) {
    super(pid);
    this.snapshotEvery = snapshotEvery;
    this.tag = tag;
    this.context = context;
  }

  public static Behavior<Command> create(String pid, int snapshotEvery) {
    return create(pid, snapshotEvery, "");
  }

  /** Every event tagged {@code tag} (the plugin stores it in the event row's tags; "" = none). */
  public static Behavior<Command> create(String pid, int snapshotEvery, String tag) {
    return Behaviors.setup(ctx -> new Entity(PersistenceId.ofUniqueId(pid), snapshotEvery, tag, ctx));
  }

  @Override
  public Set<String> tagsFor(JsonValue event) {
    return tag.isEmpty() ? Set.of() : Set.of(tag);
  }

  @Override
  public JsonValue emptyState() {
    ObjectNode root = JsonNodeFactory.instance.objectNode();
    root.putArray("events");
    return new JsonValue("", root);
  }

  @Override
  public RetentionCriteria retentionCriteria() {
    return snapshotEvery > 0 ? RetentionCriteria.snapshotEvery(snapshotEvery, 1) : RetentionCriteria.disabled();
  }

  @Override
  public CommandHandler<Command, JsonValue, JsonValue> commandHandler() {
    return newCommandHandlerBuilder()
        .forAnyState()
        .onCommand(
            Append.class,
            cmd -> Effect().persist(cmd.payloads().stream().map(p -> new JsonValue(cmd.manifest(), p)).toList())
                .thenReply(cmd.replyTo(), s -> seqNr()))
        .onCommand(Get.class, (state, cmd) -> Effect().reply(cmd.replyTo(), new Snapshot(state, seqNr())))
        .build();
  }

  private long seqNr() {
    return lastSequenceNumber(context);
  }

  @Override
  public EventHandler<JsonValue, JsonValue> eventHandler() {
    return (state, event) -> {
      ObjectNode root = state.node.isObject() ? ((ObjectNode) state.node).deepCopy() : JsonNodeFactory.instance.objectNode();
      JsonNode events = root.get("events");
      ArrayNode list = events != null && events.isArray() ? (ArrayNode) events : root.putArray("events");
      list.add(event.node);
      return new JsonValue(state.manifest, root);
    };
  }
}
