package interop;

import akka.actor.ExtendedActorSystem;
import akka.serialization.SerializerWithStringManifest;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;

/**
 * The JVM side of slice-journal's JSON serializer: the same identifier (1) and the same bytes
 * (compact UTF-8 JSON), the manifest carried through unchanged. Bound to {@link JsonValue}.
 *
 * <p>Akka gives identifier 1 to its Java serializer, which Akka 2.8 disables by default; the
 * configuration (application.conf) rebinds the "java" alias to this class, so rows with
 * event_ser_id 1 are read as JSON on both sides.
 */
public final class JsonSerializer extends SerializerWithStringManifest {
  public static final int IDENTIFIER = 1;
  static final ObjectMapper MAPPER = new ObjectMapper();

  public JsonSerializer(ExtendedActorSystem system) {}

  @Override
  public int identifier() {
    return IDENTIFIER;
  }

  @Override
  public String manifest(Object o) {
    return ((JsonValue) o).manifest;
  }

  @Override
  public byte[] toBinary(Object o) {
    try {
      return MAPPER.writeValueAsBytes(((JsonValue) o).node);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public Object fromBinary(byte[] bytes, String manifest) {
    try {
      return new JsonValue(manifest, MAPPER.readTree(bytes));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
