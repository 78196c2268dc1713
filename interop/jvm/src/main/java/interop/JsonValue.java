package interop;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * An event or a state stored as JSON: what slice-journal's JsonSerializer writes (serializer id 1),
 * with its manifest ("" for plain dicts and lists on the Python side).
 */
public final class JsonValue {
  public final String manifest;
  public final JsonNode node;

  public JsonValue(String manifest, JsonNode node) {
    this.manifest = manifest;
    this.node = node;
  }
}
