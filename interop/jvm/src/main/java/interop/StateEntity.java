package interop;

import akka.actor.typed.ActorRef;
import akka.actor.typed.Behavior;
import akka.actor.typed.javadsl.ActorContext;
import akka.actor.typed.javadsl.Behaviors;
import akka.persistence.typed.PersistenceId;
import akka.persistence.typed.state.javadsl.CommandHandler;
import akka.persistence.typed.state.javadsl.DurableStateBehavior;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;

/**
 * A typed DurableStateBehavior whose state is a JSON value (serializer id 1, manifest ""), kept by
 * the plugin's durable state store in durable_state: Put replaces the state (revision + 1), Delete
 * deletes it (the plugin's tombstone), Get replies with the state and its revision, Stop stops.
 */
public final class StateEntity extends DurableStateBehavior<StateEntity.Command, JsonValue> {
  public interface Command {}

  /** Persist {@code value} as the new state; the reply is the revision written. */
  public record Put(JsonNode value, ActorRef<Long> replyTo) implements Command {}

  /** Delete the state (a revision too); the reply is the revision written. */
  public record Delete(ActorRef<Long> replyTo) implements Command {}

  /** Reply with the state (null node: none) and its revision. */
  public record Get(ActorRef<Current> replyTo) implements Command {}

  public record Stop() implements Command {}

  public record Current(JsonNode value, long revision) {}

  private final ActorContext<Command> context;

  private StateEntity(PersistenceId pid, ActorContext<Command> context) {
    super(pid);
    this.context = context;
  }

  public static Behavior<Command> create(String pid) {
    return Behaviors.setup(ctx -> new StateEntity(PersistenceId.ofUniqueId(pid), ctx));
  }

  @Override
  public JsonValue emptyState() {
    return new JsonValue("", JsonNodeFactory.instance.nullNode());
  }

  @Override
  public CommandHandler<Command, JsonValue> commandHandler() {
    return newCommandHandlerBuilder()
        .forAnyState()
        .onCommand(Put.class, cmd -> Effect().persist(new JsonValue("", cmd.value()))
            .thenReply(cmd.replyTo(), s -> revision()))
        .onCommand(Delete.class, cmd -> Effect().delete().thenReply(cmd.replyTo(), s -> revision()))
        .onCommand(Get.class, (state, cmd) -> Effect().reply(cmd.replyTo(),
            new Current(state == null ? JsonNodeFactory.instance.nullNode() : state.node, revision())))
        .onCommand(Stop.class, cmd -> Effect().stop())
        .build();
  }

  private long revision() {
    return lastSequenceNumber(context);
  }
}
