"""Structured outputs as clients ask for them: OpenAI's ``response_format``, vLLM's ``guided_*`` fields and
``structured_outputs`` object, all turned into one ``StructuredOutputs`` spec (or a 400 naming the field).

openai-python's ``chat.completions.parse(response_format=Model)`` and LangChain's
``with_structured_output`` send ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``;
``json_object`` asks for any JSON object. A request may set at most one of these fields: the
schema says so (``ONE_GRAMMAR``), and ``structured_spec`` refuses two with a 400. Whether a schema,
regular expression or grammar compiles is the grammar backend's to say (a 400 from the engine).
"""

from __future__ import annotations

from itertools import combinations
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictStr

from infer_core.sampling_params import StructuredOutputs
from infer_core.server.errors import bad_request
from infer_core.server.request_types import NonEmptyStr, RequestModel, conditional

GRAMMAR_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                  "guided_grammar")
JsonSchema = dict[str, Any]
Choices = Annotated[list[NonEmptyStr], Field(min_length=1)]


class JsonSchemaFormat(RequestModel):
    model_config = ConfigDict(populate_by_name=True)

    name: StrictStr | None = None
    description: StrictStr | None = None
    json_schema: JsonSchema | None = Field(None, alias="schema", description="the JSON schema the output validates")
    strict: StrictBool | None = Field(None, description="accepted; the output always validates the schema")


class ResponseFormat(RequestModel):
    model_config = ConfigDict(json_schema_extra={"allOf": [conditional(
        "type", {"const": "json_schema"},
        {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}})]})

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description="with type json_schema: {name, schema, strict}")

    def check(self) -> None:
        if self.type == "json_schema" and self.json_schema is None:
            raise bad_request('response_format of type "json_schema" needs a json_schema object: '
                              '{"name": ..., "schema": {...}}', param="response_format.json_schema")


class StructuredOutputsField(RequestModel):
    """vLLM's ``structured_outputs`` request object: exactly one member."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1, "maxProperties": 1})

    # absent, never null: the schema's one-member rule counts the keys sent
    json_: JsonSchema | StrictStr = Field(None, alias="json", description="a JSON schema, or its JSON text")
    json_object: Literal[True] = Field(None, description="any JSON object")
    regex: NonEmptyStr = Field(None, description="a regular expression the whole output matches")
    choice: Choices = Field(None, description="the output is one of these strings")
    grammar: NonEmptyStr = Field(None, description="an EBNF grammar (root ::= ...)")


# what "sets" a grammar field: any value but null, and for response_format a type other than text
_ASKS: dict[str, dict[str, Any]] = {name: {"not": {"type": "null"}} for name in GRAMMAR_FIELDS}
_ASKS["response_format"] = {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}}
# JSON Schema: no two grammar fields set in one body
ONE_GRAMMAR = {"not": {"anyOf": [{"required": [a, b], "properties": {a: _ASKS[a], b: _ASKS[b]}}
                                 for a, b in combinations(GRAMMAR_FIELDS, 2)]}}


def asks_grammar(fields: tuple[str, ...] = GRAMMAR_FIELDS) -> dict[str, Any]:
    """JSON Schema: the body sets one of ``fields``."""
    return {"anyOf": [{"required": [name], "properties": {name: _ASKS[name]}} for name in fields]}


class StructuredFields(RequestModel):
    """The request fields that constrain the output; mixed into chat and completions bodies."""

    response_format: ResponseFormat | None = Field(
        None, description="OpenAI's: json_object, or json_schema (strict); text is free output")
    structured_outputs: StructuredOutputsField | None = Field(
        None, description="vLLM's: exactly one of json, json_object, regex, choice, grammar")
    guided_json: JsonSchema | StrictStr | None = Field(None, description="vLLM's: a JSON schema (or its JSON text)")
    guided_regex: NonEmptyStr | None = Field(None, description="vLLM's: a regular expression")
    guided_choice: Choices | None = Field(None, description="vLLM's: the output is one of these strings")
    guided_grammar: NonEmptyStr | None = Field(None, description="vLLM's: an EBNF grammar")

    def check(self) -> None:
        super().check()
        if self.response_format is not None:
            self.response_format.check()
        self.structured_spec()

    def structured_spec(self) -> StructuredOutputs | None:
        """The one constraint these fields ask for (None: free text); 400 naming the field when it is wrong."""
        given = [name for name in GRAMMAR_FIELDS if _asks(name, getattr(self, name))]
        if len(given) > 1:
            raise bad_request(f"{' and '.join(given)} each constrain the output; send only one of them",
                              param=given[1])
        if not given:
            return None
        name = given[0]
        try:
            return _spec(name, getattr(self, name))
        except ValueError as e:
            raise bad_request(f"{name}: {e}", param=name) from None


def _asks(name: str, value: Any) -> bool:
    if value is None:
        return False
    return not (name == "response_format" and value.type == "text")


def _spec(name: str, value: Any) -> StructuredOutputs:
    if name == "response_format":
        if value.type == "json_object":
            return StructuredOutputs(json_object=True)
        schema = value.json_schema.json_schema
        return StructuredOutputs(json=schema) if schema is not None else StructuredOutputs(json_object=True)
    if name == "structured_outputs":
        fields = value.model_dump(by_alias=True, exclude_none=True)
        return StructuredOutputs(**fields)
    return StructuredOutputs(**{name.removeprefix("guided_"): value})
