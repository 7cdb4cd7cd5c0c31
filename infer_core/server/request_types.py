"""The building blocks of the request bodies (schemas.py, structured.py, tools.py): a strict base model
and the constrained field types, each range stated so /openapi.json carries it.

Integers are read as JSON Schema counts them (2.0 is 2); booleans are not numbers and strings of
digits are not integers; no NaN or infinities.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr

MAX_N = 128  # completions per prompt, as OpenAI's limit
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's limit
TOKEN_ID_MARK = "x-token-id"  # set on token-id fields; openapi.py turns it into the vocabulary's range


def _whole_number(value: Any) -> Any:
    """JSON Schema's integers include 2.0 (a number without a fraction), so the server reads 2.0 as 2."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# integers, or numbers without a fraction; not booleans and not strings of digits (the range is checked
# on the integer, before the number is converted, so the JSON Schema keeps its minimum and maximum)
_WHOLE = BeforeValidator(_whole_number)
Int = Annotated[StrictInt, _WHOLE]
Count = Annotated[StrictInt, Field(ge=1), _WHOLE]
NonNegative = Annotated[StrictInt, Field(ge=0), _WHOLE]
NumChoices = Annotated[StrictInt, Field(ge=1, le=MAX_N), _WHOLE]
NumLogprobs = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS), _WHOLE]
TopK = Annotated[StrictInt, Field(ge=-1), _WHOLE]
# a token id of the served model: /openapi.json states the largest once the model is loaded (openapi.py)
TokenId = Annotated[StrictInt, Field(ge=0, json_schema_extra={TOKEN_ID_MARK: True}), _WHOLE]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class RequestModel(BaseModel):
    # strict: "1.5" is not a number and true is not 1; no NaN or infinities (1e400 parses as one)
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    def check(self) -> None:
        """The rules that span fields (the schema's ``if``/``then``); 400 naming the field."""


def conditional(if_present: str, if_schema: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema: when ``if_present`` is sent and matches ``if_schema``, the body must match ``then``."""
    return {"if": {"required": [if_present], "properties": {if_present: if_schema}}, "then": then}
