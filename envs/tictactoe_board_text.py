"""TicTacToe's state as a few short lines: the `board` render of the two-player env (`TwoPlayerConfig.render`).

TextArena's own messages repeat the rules, draw the board twice a turn (after the seat's move and after the
opponent's) and list the free cells in quotes and brackets: 150-470 tokens a turn for SmolLM2's tokenizer.
A policy that sees the whole state at every turn (`history_window=1`) needs only the board now. Here each
cell is one token, a mark or the free cell's number (the answer it takes to play there), so a turn's state is
about 42 tokens (the chat template's own few included):

    X 1 2
    3 O 5
    6 7 8
    Free cells: 1 2 3 5 6 7 8

The rules, which TextArena sends with the first message, move to the seat's system prompt
(`board_instructions`).
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.tictactoe_minimax import mark_of


def board_text(board: Sequence[Sequence[str]]) -> str:
    """The board (rows of "", "X", "O"), each free cell shown as its number, then the free cells listed."""
    cells = [cell or str(3 * r + c) for r, row in enumerate(board) for c, cell in enumerate(row)]
    if len(cells) != 9:
        raise ValueError(f"a TicTacToe board has 9 cells, got {len(cells)}")
    rows = [" ".join(cells[i : i + 3]) for i in range(0, 9, 3)]
    free = [cell for cell in cells if cell.isdigit()]
    return "\n".join([*rows, f"Free cells: {' '.join(free) or 'none'}"])


def board_instructions(player: int) -> str:
    """The rules for the seat of TextArena player id `player`, as the `board` render shows the game."""
    mark, other = mark_of(player), mark_of(1 - player)
    return (
        f"You play TicTacToe as {mark} (Player {player}) against {other}. Player 0 moves first. "
        f"Three {mark}s in a row, column or diagonal win. The state is the board, each free cell shown as its "
        "number. Your action is the number of a free cell."
    )
