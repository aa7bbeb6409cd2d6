"""
Reward functions for GRPO. Each one is pure: (completion: str, answer: str) -> float, or a dict of named parts
{name: float} (the reward is their sum; each part is logged as reward_<name>, its mean over the rows that
have it). A function that also takes a parameter named `sample` gets the sequence's row of the trainer's table:
token ids ("prompt", "completion"), "length", "finish" ('stop', or 'length' when max_new_tokens cut it), the
server's log-probs ("server_lp"), and in training the reference's ("ref_lp", when --beta > 0) -- e.g. a length
penalty:
    def short(completion, answer, sample): return gsm8k_reward(completion, answer) - 0.001 * sample["length"]

Two registries at the bottom:
  REWARD_FNS   what the trainer may train on (--reward NAME, or a weighted mix --reward gsm8k:1,format:0.1).
               Add yours there; shaped rewards are fine.
  CORRECT      each task's correctness check (completion, answer) -> bool: the trainer's `accuracy` and the
               held-out `eval_accuracy` count it, whatever the reward, so shaping never inflates them.

extract_number(text)   Parse the model's final numeric answer into a normalized string
                       ("1,234" -> "1234", "$5" -> "5", "3.50" -> "3.5", "42." -> "42").
                       Precedence: the number after the LAST "####" (GSM8K style, and the
                       format our prompt asks for) wins; else the LAST \\boxed{...}; else
                       the LAST number anywhere in the text. None if there is no number.
gsm8k_correct / _reward  whether (1.0 / 0.0) the completion's final number equals the final number
                       of the GSM8K answer ("...reasoning...\\n#### 72", or just "72").
format_reward          1.0 if the completion has a line "#### <number>" or a "\\boxed{<number>}".
                       A small *shaping* reward: it teaches the output format early on, when
                       correctness rewards are still mostly zero. Weight it low (e.g. 0.1),
                       otherwise the policy learns to format wrong answers nicely.
arithmetic_correct / _reward  Built-in offline task ("What is 7 + 12?" -> "19"): whether the
                       LAST number in the completion equals the answer.
gsm8k_format_reward    gsm8k_reward + 0.1 * format_reward: an example of a shaped reward.
safe_reward            Wraps any reward fn so a buggy or weird return value can never crash
                       (or poison with NaN) a training step: it becomes 0.0 plus a counted warning.
REWARD_FNS / get_reward_fn   Name -> reward registry, used by the trainer's --reward flag.
combine                --reward -> the trainer's reward: (sample, warnings) -> (reward, {part: value}).
CORRECT                Task -> correctness check: what accuracy counts.
"""
import inspect
import math
import numbers
import re
from decimal import Decimal, InvalidOperation

# One number: optional minus, optional "$", then either properly comma-grouped digits
# ("1,234,567") or plain digits, then an optional decimal part. A trailing "." with no
# digits after it ("42.") is left out, so sentence-ending periods are harmless.
# (?<!\d) stops the "-" in "10-3" being read as a negative sign.
_NUM = r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUM_RE = re.compile(r"(?<!\d)" + _NUM)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")  # no nested braces: keeps the regex simple
_FORMAT_RE = re.compile(  # "#### 42" on its own line, or \boxed{42} / \boxed{\$42} anywhere
    r"^[ \t]*####[ \t]*" + _NUM + r"\.?[ \t]*$|\\boxed\{\s*\\?" + _NUM + r"\s*\}", re.MULTILINE)


def _normalize(num: str) -> str | None:
    """'$1,234.50' -> '1234.5'. Canonical strings, so equal numbers give equal strings."""
    try:
        d = Decimal(num.replace(",", "").replace("$", ""))
    except InvalidOperation:
        return None
    if d == d.to_integral_value():
        return str(int(d))  # "72.00" -> "72", and "-0" -> "0"
    return format(d.normalize(), "f")  # "3.50" -> "3.5", and never "1E+1" style


def _last_number(text: str) -> str | None:
    nums = _NUM_RE.findall(text)
    return _normalize(nums[-1]) if nums else None


def extract_number(text: str) -> str | None:
    # "####" wins even if more numbers follow it: the model was told to put its answer
    # there, so anything after (a "check", a step count) is not the answer.
    if "####" in text:
        m = _NUM_RE.search(text.rsplit("####", 1)[1])  # FIRST number after the LAST ####
        if m:
            return _normalize(m.group())
    boxed = _BOXED_RE.findall(text)
    if boxed:
        num = _last_number(boxed[-1])  # "\$5" inside the box still parses: "$" is optional
        if num is not None:
            return num
    # Fallback: models usually end with the answer ("... so she has 18 apples.").
    return _last_number(text)


def gsm8k_correct(completion: str, answer: str) -> bool:
    pred, gold = extract_number(completion), extract_number(answer)
    # Normalized strings are canonical, so string equality is numeric equality.
    return pred is not None and pred == gold


def gsm8k_reward(completion: str, answer: str) -> float:
    return float(gsm8k_correct(completion, answer))


def format_reward(completion: str, answer: str | None = None) -> float:
    return 1.0 if _FORMAT_RE.search(completion) else 0.0  # answer unused: format only


def arithmetic_correct(completion: str, answer: str) -> bool:
    # Last number, not "any number": the question's own numbers ("7", "12") appear in most
    # completions, so "contains the answer" would be trivially hackable; the last number is
    # where a solution ends up ("7 + 12 = 19"). Deliberately strict: no ####/boxed logic.
    pred = _last_number(completion)
    return pred is not None and pred == _normalize(answer.strip())


def arithmetic_reward(completion: str, answer: str) -> float:
    return float(arithmetic_correct(completion, answer))


def gsm8k_format_reward(completion: str, answer: str) -> float:
    """A shaped reward: correctness plus a small bonus for the '#### <number>' format (see format_reward)."""
    return gsm8k_reward(completion, answer) + 0.1 * format_reward(completion)


def safe_reward(fn, completion: str, answer: str, warnings, sample=None):
    """Call fn (with the sample if it takes one); anything other than a finite real number (or a dict of them)
    becomes 0.0 and a counted warning. One NaN reward would turn the whole group's advantages into NaN."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        r = fn(completion, answer, sample=sample) if wants_sample(fn) else fn(completion, answer)
        bad = [why for v in (r.values() if isinstance(r, dict) and r else [r]) if (why := not_a_number(v))]
        if not bad:
            return {k: float(v) for k, v in r.items()} if isinstance(r, dict) else float(r)
        reason = bad[0]
    except Exception as e:  # not BaseException: Ctrl-C should still stop training
        reason = f"raised {type(e).__name__}"
    key = f"{name}: {reason}"
    warnings[key] = warnings.get(key, 0) + 1
    return 0.0


def not_a_number(r):
    """-> why r is not a finite real number, or None. Bools are ints, so True -> 1.0 is fine."""
    if r is None:
        return "returned None"
    if not isinstance(r, numbers.Real):
        return f"returned non-number {type(r).__name__}"
    if math.isnan(float(r)) or math.isinf(float(r)):
        return f"returned {'NaN' if math.isnan(float(r)) else 'inf'}"
    return None


def wants_sample(fn):
    try:
        return "sample" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def combine(spec, task):
    """--reward -> fn(sample, warnings) -> (reward, {part: value}). spec: 'auto' (the task's reward), a name in
    REWARD_FNS, or a weighted mix 'name:weight,name:weight' (TRL's reward_funcs + reward_weights): the reward is the
    weighted sum, and each function's value is logged unweighted as a part (a dict's entries, each as its own)."""
    terms = []
    for item in spec.split(","):
        name, _, weight = item.strip().partition(":")
        try:
            terms.append((name, get_reward_fn(task if name == "auto" else name), float(weight or 1)))
            if not math.isfinite(terms[-1][2]):  # a NaN weight makes every reward NaN, then NaN gradients
                raise ValueError
        except ValueError as e:
            raise ValueError(str(e) if "unknown" in str(e) else f"{item!r}: the weight must be a finite number "
                             f"(e.g. gsm8k:1,format:0.1)") from None
    if not any(w for _, _, w in terms):  # every reward 0: every advantage 0, a run that trains on nothing
        raise ValueError(f"{spec!r}: every weight is 0, so every reward would be 0: give at least one term a weight "
                         f"other than 0 (e.g. gsm8k:1,format:0.1)")

    def reward(sample, warnings):
        total, parts = 0.0, {}
        for name, fn, weight in terms:
            r = safe_reward(fn, sample["text"], sample["answer"], warnings, sample)
            if isinstance(r, dict):
                parts.update(r)
                r = sum(r.values())
            elif len(terms) > 1:
                parts[name] = r
            total += weight * r
        return total, parts
    return reward


REWARD_FNS = {"gsm8k": gsm8k_reward, "arithmetic": arithmetic_reward, "format": format_reward,
              "gsm8k_format": gsm8k_format_reward}
CORRECT = {"gsm8k": gsm8k_correct, "arithmetic": arithmetic_correct}  # task -> correctness check


def get_reward_fn(name: str):
    if name not in REWARD_FNS:
        raise ValueError(f"unknown reward function {name!r}; valid names: {', '.join(sorted(REWARD_FNS))}")
    return REWARD_FNS[name]
